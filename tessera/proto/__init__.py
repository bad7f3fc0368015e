"""The kubelet gRPC APIs Tessera's DRA kubelet plugin speaks, as Python modules.

Our own ``.proto`` files (plugin registration v1, DRA v1 and v1beta1, DRA health v1 and v1alpha1)
sit in subfolders; the build (``setup.py``) turns each ``<folder>/api.proto`` into
``<folder>/api_pb2.py`` and ``<folder>/api_pb2_grpc.py`` with :mod:`tessera.proto.generate`.
The generated modules are build outputs: never committed, never edited. See ``proto/README.md``.
"""
