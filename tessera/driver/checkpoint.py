"""The driver's record of prepared claims: versioned, checksummed, bound to one boot.

The kubelet may call prepare twice, and the daemon may be killed at any instruction, so each claim
is recorded as ``PrepareStarted`` before its side effects and ``PrepareCompleted`` after them; a
retry after a crash redoes a started claim and returns a completed one as it is.

The file is ``{"version": N, "checksum": sha256(data), "data": {...}}``. The checksum is taken over
the ``data`` object exactly as stored (canonical JSON of what was parsed, never re-marshalled
through our own types), so a newer daemon that adds a field cannot make an older file look
corrupt (NVIDIA's driver crash-looped on that, nv#1080). Readers convert every older version they
know to the current one. A file that cannot be read — garbage, a bad checksum, a version from the
future — is never fatal: it is moved aside (``checkpoint.json.quarantined-<time>``), logged, and the
daemon rebuilds its state from the API and the claim folders on the host.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.files import write_atomically

log = logging.getLogger(__name__)

VERSION = 1
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"


def in_state_dir(state_dir: Path) -> Path:
    """Where the checkpoint of a node's state folder is: the daemon writes it, the exporter reads it."""
    return state_dir / "checkpoint.json"


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as returned to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str
    devices: tuple[PreparedDevice, ...] = ()


@dataclass
class Checkpoint:
    boot_id: str
    claims: dict[str, ClaimRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class Loaded:
    checkpoint: Checkpoint
    rebuild: str | None
    """Why the prepared state must be rebuilt from the API and the host (None: the file is good)."""


def _data(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "bootId": checkpoint.boot_id,
        "claims": {
            uid: {
                "namespace": r.namespace,
                "name": r.name,
                "state": r.state,
                "devices": [
                    {
                        "requestNames": list(d.request_names),
                        "pool": d.pool,
                        "device": d.device,
                        "cdiDeviceIDs": list(d.cdi_device_ids),
                        **({"shareID": d.share_id} if d.share_id else {}),
                    }
                    for d in r.devices
                ],
            }
            for uid, r in sorted(checkpoint.claims.items())
        },
    }


def _checksum(data: Mapping[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _from_v1(data: Mapping[str, Any]) -> Checkpoint:
    claims = {}
    for uid, r in data["claims"].items():
        if r["state"] not in (PREPARE_STARTED, PREPARE_COMPLETED):
            raise ValueError(f"claim {uid} has unknown state {r['state']!r}")
        devices = tuple(
            PreparedDevice(
                request_names=tuple(d["requestNames"]),
                pool=d["pool"],
                device=d["device"],
                cdi_device_ids=tuple(d["cdiDeviceIDs"]),
                share_id=d.get("shareID"),
            )
            for d in r["devices"]
        )
        claims[uid] = ClaimRecord(uid, r["namespace"], r["name"], r["state"], devices)
    return Checkpoint(str(data["bootId"]), claims)


# Every version this daemon can read, converted to the current model. A new version adds its
# reader here and keeps the old ones, so an upgrade never strands a node's prepared claims.
_READERS: dict[int, Callable[[Mapping[str, Any]], Checkpoint]] = {1: _from_v1}


def encode(checkpoint: Checkpoint) -> str:
    data = _data(checkpoint)
    return json.dumps({"version": VERSION, "checksum": _checksum(data), "data": data}, indent=1)


def decode(text: str) -> Checkpoint:
    """Parse a checkpoint of any known version; ValueError says what is wrong."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValueError("not a checkpoint object")
    version = document.get("version")
    reader = _READERS.get(version) if isinstance(version, int) else None
    if reader is None:
        raise ValueError(f"version {version!r} is not one this driver reads ({sorted(_READERS)})")
    data = document.get("data")
    if not isinstance(data, dict) or document.get("checksum") != _checksum(data):
        raise ValueError("checksum mismatch: the file was changed or cut short")
    try:
        return reader(data)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"malformed version-{version} content: {error!r}") from None


def save(path: Path, checkpoint: Checkpoint) -> None:
    """Write durably: a prepared claim must still be known after a crash or power loss."""
    write_atomically(path, encode(checkpoint), mode=0o600, durable=True)


def load(path: Path, boot_id: str) -> Loaded:
    """The checkpoint at ``path`` for this boot. A missing file is an empty checkpoint; a file from
    another boot, or one that cannot be read (then quarantined), asks for a rebuild."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Loaded(Checkpoint(boot_id), None)
    try:
        checkpoint = decode(text)
    except ValueError as error:
        quarantined = path.with_name(f"{path.name}.quarantined-{time.strftime('%Y%m%dT%H%M%S')}")
        path.replace(quarantined)
        log.error("checkpoint %s is unreadable (%s); moved to %s, rebuilding", path, error, quarantined)
        return Loaded(Checkpoint(boot_id), f"checkpoint unreadable: {error}")
    if checkpoint.boot_id != boot_id:
        return Loaded(Checkpoint(boot_id), f"node rebooted (boot ID {checkpoint.boot_id} -> {boot_id})")
    return Loaded(checkpoint, None)


def read_boot_id(path: Path) -> str:
    return path.read_text().strip()
