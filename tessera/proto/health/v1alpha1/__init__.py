"""DRA health v1alpha1 (proto package ``v1alpha1``); the build generates ``api_pb2{,_grpc}`` here."""
