"""Compiled and generated parts of the package; everything else is in pyproject.toml.

cffi builds ``tessera.shim._format`` (the Python binding of the shim's formats) from
``tessera/shim/build.py:ffibuilder``; the build_ext step then compiles the preload libraries (plain
C, no Python) into ``tessera/shim/lib`` and generates the kubelet gRPC stubs (``api_pb2.py``,
``api_pb2_grpc.py``) from ``tessera/proto/**/*.proto`` beside them - in place for editable
installs, into the build tree for wheels - so both carry them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def load(name: str, path: Path) -> ModuleType:
    """Load a build helper from its file: the package itself is not importable while it is built."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildExtWithShim(build_ext):
    def run(self) -> None:
        super().run()
        shim = ROOT / "tessera" / "shim"
        out = shim / "lib" if self.inplace else Path(self.build_lib) / "tessera" / "shim" / "lib"
        load("tessera_shim_build", shim / "build.py").build_preload(out)
        load("tessera_proto_generate", ROOT / "tessera" / "proto" / "generate.py").generate(
            ROOT if self.inplace else Path(self.build_lib)
        )


setup(cffi_modules=["tessera/shim/build.py:ffibuilder"], cmdclass={"build_ext": BuildExtWithShim})
