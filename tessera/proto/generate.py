"""Generate the Python gRPC stubs of every ``.proto`` file in this folder.

The stubs are build outputs (``setup.py`` calls :func:`generate`), never committed or edited, so a
``.proto`` file is the only thing anyone changes. ``python -m tessera.proto.generate [OUT_ROOT]``
(or ``python tessera/proto/generate.py``) does the same by hand.

Every upstream file is called ``api.proto`` and protobuf keeps one descriptor pool per process keyed
by file name, so each file is compiled under its path inside the package - ``tessera/proto/dra/v1/
api.proto`` - which keeps the names unique and makes ``api_pb2_grpc`` import its ``api_pb2`` as
``tessera.proto.dra.v1``. protoc's ``-I VIRTUAL=REAL`` mapping gives the files that path wherever
this folder is (the source tree, an sdist, an installed package).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

#: This folder, which holds the .proto files.
PROTO_ROOT = Path(__file__).resolve().parent
#: Where the .proto files appear to protoc, and so where the stubs land below an output root.
PACKAGE_PATH = "tessera/proto"
#: The files protoc writes for each ``api.proto``: the messages and the gRPC client/server classes.
STUB_SUFFIXES = ("_pb2.py", "_pb2_grpc.py")


def proto_files(root: Path = PROTO_ROOT) -> list[str]:
    """Every .proto file below ``root``, as protoc sees it (``tessera/proto/...``), sorted."""
    return sorted(f"{PACKAGE_PATH}/{path.relative_to(root).as_posix()}" for path in root.rglob("*.proto"))


def stub_paths(proto: str) -> list[str]:
    """The stubs protoc writes for ``proto`` (a :func:`proto_files` entry), relative to the output root."""
    stem = proto.removesuffix(".proto")
    return [stem + suffix for suffix in STUB_SUFFIXES]


def run_protoc(args: Sequence[str], root: Path = PROTO_ROOT) -> None:
    """Run the protoc bundled with grpcio-tools (in-process) with ``root`` mapped to ``tessera/proto``.

    grpcio-tools is imported here, not at module level, so that importing this module (to list the
    files, say) does not need the build-time dependency.
    """
    from grpc_tools import protoc

    argv = ["grpc_tools.protoc", f"--proto_path={PACKAGE_PATH}={root}", *args]
    status = protoc.main(argv)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}: {' '.join(argv)}")


def generate(out_root: Path, root: Path = PROTO_ROOT) -> list[Path]:
    """Write ``tessera/proto/<folder>/api_pb2{,_grpc}.py`` below ``out_root`` for every .proto file.

    ``out_root`` is the folder that holds the ``tessera`` package: the repository root for an
    in-place (editable) build; the build tree for a wheel. Returns the files written.
    """
    protos = proto_files(root)
    if not protos:
        raise RuntimeError(f"no .proto files below {root}")
    (out_root / PACKAGE_PATH).mkdir(parents=True, exist_ok=True)
    run_protoc([f"--python_out={out_root}", f"--grpc_python_out={out_root}", *protos], root)
    return [out_root / stub for proto in protos for stub in stub_paths(proto)]


def default_out_root() -> Path:
    """The output root that holds this folder as ``tessera/proto``, so stubs land beside their .proto."""
    return PROTO_ROOT.parents[1]


def main(argv: Sequence[str] = sys.argv[1:]) -> int:
    """Generate into the given output root, by default the one that holds this folder."""
    out_root = Path(argv[0]) if argv else default_out_root()
    for path in generate(out_root):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
