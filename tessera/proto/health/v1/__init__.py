"""DRA health v1 (proto package ``v1``); the build generates ``api_pb2{,_grpc}`` here."""
