"""Where the built shim is, how it is laid out next to a driver, and how a process runs under it.

A shim installation is one directory holding the two preload libraries and, beside each, the
alias symlink its ``DT_NEEDED`` entry names (``libcuda-real.so.1`` -> the real
``libcuda.so.1``, ``libnvidia-ml-real.so.1`` -> the real ``libnvidia-ml.so.1``). The libraries
find the aliases through their ``$ORIGIN`` runpath, so nothing else needs configuring. The
symlink targets are paths as the process that loads the shim sees them (inside a container: the
container's path of the injected driver library).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.shim.format import LIMITS_ENV, LOG_ENV, REGION_ENV

CUDA_LIBRARY = "libtessera-cuda.so"
NVML_LIBRARY = "libtessera-nvml.so"
CUDA_ALIAS = "libcuda-real.so.1"
NVML_ALIAS = "libnvidia-ml-real.so.1"


def built_library_dir() -> Path:
    """Where the package build put the preload libraries."""
    return Path(__file__).resolve().parent / "lib"


@dataclass(frozen=True)
class Installation:
    """A directory with the shim libraries and their aliases."""

    directory: Path

    @property
    def cuda(self) -> Path:
        return self.directory / CUDA_LIBRARY

    @property
    def nvml(self) -> Path:
        return self.directory / NVML_LIBRARY

    def env(
        self,
        limits: Path | None,
        region: Path | None,
        base: Mapping[str, str] | None = None,
        log_level: str | None = None,
    ) -> dict[str, str]:
        """``base`` (default: this process's environment) with both libraries preloaded and the
        claim's limits file and usage region named."""
        env = dict(os.environ if base is None else base)
        preload = [str(self.cuda), str(self.nvml)]
        if env.get("LD_PRELOAD"):
            preload.append(env["LD_PRELOAD"])
        env["LD_PRELOAD"] = ":".join(preload)
        for name, value in ((LIMITS_ENV, limits), (REGION_ENV, region)):
            if value is None:
                env.pop(name, None)
            else:
                env[name] = str(value)
        if log_level is not None:
            env[LOG_ENV] = log_level
        return env


def install(directory: Path, real_cuda: Path, real_nvml: Path, source: Path | None = None) -> Installation:
    """Copy the preload libraries from ``source`` (default: the package's) into ``directory`` and
    point the aliases at the real driver libraries."""
    source = built_library_dir() if source is None else source
    directory.mkdir(parents=True, exist_ok=True)
    for name in (CUDA_LIBRARY, NVML_LIBRARY):
        tmp = directory / f".{name}.tmp"
        shutil.copyfile(source / name, tmp)
        tmp.chmod(0o755)
        tmp.replace(directory / name)
    for alias, target in ((CUDA_ALIAS, real_cuda), (NVML_ALIAS, real_nvml)):
        link = directory / alias
        tmp = directory / f".{alias}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        tmp.replace(link)
    return Installation(directory)
