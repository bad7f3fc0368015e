"""A prepared claim's folder on the host: limits file, usage region, shim, ld.so.preload; and the
GPUs' priority boards beside the claims.

One folder per claim, ``<state dir>/claims/<claim UID>/``, holds everything of that claim its
containers mount, so unprepare removes one folder and nothing is left behind. A claim with
enforcement off (a whole GPU, share_config.py) has only its identity and an ld.so.preload naming the
driver's own libraries there. Each shared GPU's
priority board, ``<state dir>/priority/<GPU UUID>``, outlives the claims: every shared container on
the GPU mounts the same file (read-write only for high-priority claims). The limits file, the usage
region and the boards are written only through ``tessera.shim.format`` (the shim's own C code),
never by hand.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tessera.files import write_atomically
from tessera.shim import format as shim_format
from tessera.shim.install import Installation, install

CONTAINER_DIR = PurePosixPath("/run/tessera")
"""Where the claim's folder is mounted, read-only, whole: one mount point, which a tenant cannot
rename, holds everything the shim and the loader depend on (the shim reads its limits only after
the kernel confirms they are this mount's, tessera/shim/src/limits_source.h)."""
CONTAINER_LIMITS = CONTAINER_DIR / "limits"
CONTAINER_REGION = CONTAINER_DIR / "usage"
CONTAINER_SHIM_DIR = CONTAINER_DIR / "shim"
CONTAINER_PRELOAD = PurePosixPath("/etc/ld.so.preload")
CONTAINER_BOARDS = CONTAINER_DIR / "priority"


@dataclass(frozen=True)
class ClaimFiles:
    """The host paths of one claim's folder."""

    directory: Path

    @property
    def limits(self) -> Path:
        return self.directory / "limits"

    @property
    def region(self) -> Path:
        return self.directory / "usage"

    @property
    def shim(self) -> Path:
        return self.directory / "shim"

    @property
    def preload(self) -> Path:
        return self.directory / "ld.so.preload"

    @property
    def identity(self) -> Path:
        """namespace, name and UID: lets a lost checkpoint be rebuilt from the folders."""
        return self.directory / "claim.json"


def in_state_dir(state_dir: Path) -> Path:
    """The folder of every claim's folder in a node's state folder (the exporter reads it too)."""
    return state_dir / "claims"


def claim_files(claims_dir: Path, uid: str) -> ClaimFiles:
    return ClaimFiles(claims_dir / uid)


def boards_in_state_dir(state_dir: Path) -> Path:
    """The folder of the GPUs' priority boards in a node's state folder."""
    return state_dir / "priority"


def board(state_dir: Path, gpu_uuid: str) -> Path:
    """The GPU's priority board, created if missing (an existing one is kept: containers have it
    mounted)."""
    boards = boards_in_state_dir(state_dir)
    boards.mkdir(parents=True, exist_ok=True)
    return shim_format.create_board(boards / gpu_uuid)


def write(
    files: ClaimFiles,
    namespace: str,
    name: str,
    uid: str,
    limits: Sequence[shim_format.GpuLimit],
    container_cuda: PurePosixPath,
    container_nvml: PurePosixPath,
    enforced: bool = True,
    nested: Sequence[PurePosixPath] = (),
) -> None:
    """Write (or rewrite, identically) the claim's folder. The usage region is created only if
    missing: a retried prepare must not reset what running processes have recorded. Not
    ``enforced``: the identity, and an ld.so.preload that loads the driver's libraries where the
    container sees them - what the shim's own DT_NEEDED would have loaded - so that a program's
    ``dlopen("libcuda.so.1")`` finds them wherever the driver's mounts put them. ``nested``: the
    container paths under :data:`CONTAINER_DIR` that other mounts of the claim's spec cover (the
    priority boards, the driver's libraries); the folder is mounted read-only, so the runtime
    cannot create their mount points in it, and each gets an empty file here."""
    write_identity(files, namespace, name, uid)
    if not enforced:
        write_atomically(files.preload, f"{container_cuda}\n{container_nvml}\n", mode=0o444)
        return
    shim_format.write_limits(files.limits, limits)
    shim_format.create_region(files.region)
    installation: Installation = install(files.shim, Path(container_cuda), Path(container_nvml))
    preload = [CONTAINER_SHIM_DIR / installation.cuda.name, CONTAINER_SHIM_DIR / installation.nvml.name]
    write_atomically(files.preload, "".join(f"{p}\n" for p in preload), mode=0o444)
    for container_path in nested:
        point = files.directory / container_path.relative_to(CONTAINER_DIR)
        point.parent.mkdir(parents=True, exist_ok=True)
        point.touch(mode=0o444, exist_ok=True)


def write_identity(files: ClaimFiles, namespace: str, name: str, uid: str) -> None:
    """Only the claim's identity: all a claim without the shim (a MIG instance) keeps on the host,
    so that a lost checkpoint can still be rebuilt from the folders."""
    files.directory.mkdir(parents=True, exist_ok=True)
    write_atomically(files.identity, json.dumps({"namespace": namespace, "name": name, "uid": uid}))


def read_identity(files: ClaimFiles) -> tuple[str, str, str] | None:
    """(namespace, name, uid) recorded in the folder, or None if it is missing or unreadable."""
    try:
        data = json.loads(files.identity.read_text())
        return str(data["namespace"]), str(data["name"]), str(data["uid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(files: ClaimFiles) -> None:
    """Remove the claim's folder; a folder already gone is fine."""
    shutil.rmtree(files.directory, ignore_errors=True)


def claim_uids(claims_dir: Path) -> list[str]:
    """The UIDs of every claim folder on the host."""
    if not claims_dir.is_dir():
        return []
    return sorted(p.name for p in claims_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
