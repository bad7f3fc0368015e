"""Compiled parts of the package; everything else is in pyproject.toml.

cffi builds ``tessera.shim._format`` (the Python binding of the shim's formats) from
``shim/build.py:ffibuilder``; the build_ext step then compiles the preload libraries (plain C,
no Python) into ``tessera/shim/lib`` - in place for editable installs, into the build tree for
wheels - so both carry them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class BuildExtWithShim(build_ext):
    def run(self) -> None:
        super().run()
        spec = importlib.util.spec_from_file_location("tessera_shim_build", ROOT / "shim" / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = ROOT / "shim" / "lib" if self.inplace else Path(self.build_lib) / "tessera" / "shim" / "lib"
        module.build_preload(out)


setup(cffi_modules=["shim/build.py:ffibuilder"], cmdclass={"build_ext": BuildExtWithShim})
