"""The gRPC stubs in the package are exactly what the .proto files generate now.

The stubs are build outputs (never committed), so a .proto file edited without rebuilding would
leave code running against the old wire format; this catches it, and a stub left behind by a
removed .proto file too.
"""

from __future__ import annotations

from pathlib import Path

from tessera.proto.generate import PACKAGE_PATH, PROTO_ROOT, STUB_SUFFIXES, generate, proto_files


def built_stubs() -> set[str]:
    return {
        path.relative_to(PROTO_ROOT).as_posix()
        for suffix in STUB_SUFFIXES
        for path in PROTO_ROOT.rglob(f"*{suffix}")
    }


def test_every_proto_file_is_compiled_under_its_own_package_path() -> None:
    assert proto_files() == [
        "tessera/proto/dra/v1/api.proto",
        "tessera/proto/dra/v1beta1/api.proto",
        "tessera/proto/health/v1/api.proto",
        "tessera/proto/health/v1alpha1/api.proto",
        "tessera/proto/registration/v1/api.proto",
    ]


def test_built_stubs_are_byte_identical_to_freshly_generated_ones(tmp_path: Path) -> None:
    fresh_root = tmp_path / PACKAGE_PATH
    fresh = {path.relative_to(fresh_root).as_posix(): path for path in generate(tmp_path)}
    assert built_stubs() == set(fresh), "stubs and .proto files differ: rebuild (pip install -e .)"
    stale = [name for name, path in fresh.items() if (PROTO_ROOT / name).read_bytes() != path.read_bytes()]
    assert not stale, f"stale stubs {stale}: a .proto file changed since the last build (pip install -e .)"


def test_grpc_stubs_import_their_messages_by_full_package_path() -> None:
    grpc_stub = (PROTO_ROOT / "dra" / "v1" / "api_pb2_grpc.py").read_text()
    assert "from tessera.proto.dra.v1 import api_pb2 as " in grpc_stub
