"""DRA v1 (``k8s.io.kubelet.pkg.apis.dra.v1``); the build generates ``api_pb2{,_grpc}`` here."""
