"""A claim's CDI spec: what the container runtime adds to every container that uses the claim.

One transient spec file per claim in the CDI directory, named as CDI names transient specs
(``<vendor>-<class>_<claim UID>.json``), written atomically and removed on unprepare. Each share is
one CDI device whose name carries the claim UID, the GPU and the scheduler's shareID, so a claim
holding two shares of one GPU gets two distinct devices (kubernetes#134519). What every share of
the claim needs (the claim's folder - shim, limits file, usage region - mounted whole at
/run/tessera, /etc/ld.so.preload, its GPUs' priority boards, the environment) sits in the
spec-wide edits, applied once whichever of the claim's
devices a container names. A claim with enforcement off (whole GPUs, share_config.py) gets its GPUs
and the driver's libraries, nothing of the shim.

A claim of MIG instances gets a spec of its own (:func:`mig_spec`): the instances named in
CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES, the driver, and nothing of the shim.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tessera.driver.claim_files import (
    CONTAINER_BOARDS,
    CONTAINER_DIR,
    CONTAINER_LIMITS,
    CONTAINER_PRELOAD,
    CONTAINER_REGION,
    ClaimFiles,
)
from tessera.driver.config import CDI_CLASS, CDI_KIND, CDI_VENDOR
from tessera.files import write_atomically
from tessera.shim.format import LIMITS_ENV, REGION_ENV

CDI_VERSION = "0.6.0"


@dataclass(frozen=True)
class CdiDevice:
    """One share as a CDI device: its name in our spec and the GPU it is on (for a MIG instance,
    the instance's MIG UUID)."""

    name: str
    gpu_uuid: str
    device_nodes: tuple[Path, ...] = ()

    @property
    def qualified_name(self) -> str:
        return f"{CDI_KIND}={self.name}"


def device_name(claim_uid: str, device: str, share_id: str | None) -> str:
    """Unique per share: two shares of one GPU in one claim differ by their shareID."""
    return f"{claim_uid}-{device}" + (f"-{share_id}" if share_id else "")


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


def spec(
    devices: Sequence[CdiDevice],
    files: ClaimFiles,
    gpu_uuids: Sequence[str],
    libraries: Mapping[PurePosixPath, Path],
    common_device_nodes: Sequence[Path],
    extra_env: Sequence[tuple[str, str]],
    extra_mounts: Sequence[Path],
    boards: Sequence[tuple[Path, bool]] = (),
    enforced: bool = True,
) -> dict[str, Any]:
    """The claim's spec. ``libraries`` maps container paths to host paths of driver libraries the
    spec mounts itself (empty when NVIDIA's toolkit spec provides them). ``boards``: each GPU's
    priority board (named by the GPU's UUID) and whether this claim may write it (high priority);
    the rest mount it read-only, so a low-priority tenant cannot raise itself. Not ``enforced``:
    the GPUs without the shim, its files or its variables; the claim's ld.so.preload then names
    the driver's libraries themselves."""
    visible = ",".join(gpu_uuids)
    shim_env = [f"{LIMITS_ENV}={CONTAINER_LIMITS}", f"{REGION_ENV}={CONTAINER_REGION}"]
    env = [
        *(shim_env if enforced else []),
        f"CUDA_VISIBLE_DEVICES={visible}",
        f"NVIDIA_VISIBLE_DEVICES={visible}",
        *(f"{k}={v}" for k, v in extra_env),
    ]
    # The folder first: CDI orders mounts by depth, and the ones inside it cover the empty files
    # claim_files.write left for them.
    shim_mounts = [
        _mount(files.directory, CONTAINER_DIR, read_only=True),
        _mount(files.region, CONTAINER_REGION, read_only=False),
        _mount(files.preload, CONTAINER_PRELOAD, read_only=True),
        *(_mount(board, CONTAINER_BOARDS / board.name, read_only=not writable) for board, writable in boards),
    ]
    driver_preload = [_mount(files.preload, CONTAINER_PRELOAD, read_only=True)]
    mounts = [
        *(shim_mounts if enforced else driver_preload),
        *(_mount(host, container, read_only=True) for container, host in sorted(libraries.items())),
        *(_mount(path, PurePosixPath(path), read_only=False) for path in extra_mounts),
    ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "containerEdits": {
            "env": env,
            "mounts": mounts,
            "deviceNodes": [{"path": str(node)} for node in common_device_nodes],
        },
        "devices": _devices(devices, "TESSERA_SHARE_"),
    }


def mig_spec(
    devices: Sequence[CdiDevice],
    libraries: Mapping[PurePosixPath, Path],
    common_device_nodes: Sequence[Path],
    extra_env: Sequence[tuple[str, str]],
    extra_mounts: Sequence[Path],
) -> dict[str, Any]:
    """The spec of a claim of whole MIG instances: CUDA sees exactly those instances (by MIG UUID),
    with the driver's libraries (``libraries``: where the loader finds them without the shim) and
    nodes, and no shim, limits or preload: the hardware isolates the instance, and the shim would
    only add its cost."""
    visible = ",".join(d.gpu_uuid for d in devices)
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "containerEdits": {
            "env": [
                f"CUDA_VISIBLE_DEVICES={visible}",
                f"NVIDIA_VISIBLE_DEVICES={visible}",
                *(f"{k}={v}" for k, v in extra_env),
            ],
            "mounts": [
                *(_mount(host, container, read_only=True) for container, host in sorted(libraries.items())),
                *(_mount(path, PurePosixPath(path), read_only=False) for path in extra_mounts),
            ],
            "deviceNodes": [{"path": str(node)} for node in common_device_nodes],
        },
        "devices": _devices(devices, "TESSERA_MIG_"),
    }


def _devices(devices: Sequence[CdiDevice], env_prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "name": d.name,
            "containerEdits": {
                # Every CDI device needs at least one edit; this one also tells a user in the
                # container which GPU (or MIG instance) each device is.
                "env": [f"{env_prefix}{_env_suffix(d.name)}={d.gpu_uuid}"],
                "deviceNodes": [{"path": str(node)} for node in d.device_nodes],
            },
        }
        for d in devices
    ]


def write(cdi_dir: Path, claim_uid: str, claim_spec: Mapping[str, Any]) -> Path:
    """Write the claim's spec atomically (containerd watches the folder)."""
    return write_atomically(spec_path(cdi_dir, claim_uid), json.dumps(claim_spec, indent=1))


def remove(cdi_dir: Path, claim_uid: str) -> None:
    spec_path(cdi_dir, claim_uid).unlink(missing_ok=True)


def claim_uids(cdi_dir: Path) -> list[str]:
    """Claim UIDs of the specs this driver left in ``cdi_dir``."""
    prefix = f"{CDI_VENDOR}-{CDI_CLASS}_"
    if not cdi_dir.is_dir():
        return []
    return sorted(
        p.name.removeprefix(prefix).removesuffix(".json")
        for p in cdi_dir.iterdir()
        if p.name.startswith(prefix) and p.name.endswith(".json")
    )


def _mount(host: Path, container: PurePosixPath, read_only: bool) -> dict[str, Any]:
    return {
        "hostPath": str(host),
        "containerPath": str(container),
        "options": ["ro" if read_only else "rw", "nosuid", "nodev", "bind"],
    }


def _env_suffix(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).upper()
