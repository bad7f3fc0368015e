"""DRA v1beta1 (``k8s.io.kubelet.pkg.apis.dra.v1beta1``); the build generates ``api_pb2{,_grpc}`` here."""
