"""Plugin registration v1 (proto package ``pluginregistration``); ``api_pb2{,_grpc}`` are generated here."""
