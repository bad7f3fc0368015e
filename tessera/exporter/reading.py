"""What the exporter reads about the node's claims and GPU processes, shared by the scrape-time
collector (tessera/exporter/collector.py) and the bypass loop (tessera/exporter/bypass_loop.py).

Each of the two keeps a reader of its own (they run on different threads; a reader's cache is not
shared). Nothing a tenant writes is trusted or mapped: a claim's usage region is read as a private
copy (``tessera.shim.format.read_region``), and a process is tied to its container by its cgroup
(tessera/exporter/cgroups.py), never by anything the process controls.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.driver import claim_files
from tessera.exporter import cgroups
from tessera.exporter.containers import ContainerRef
from tessera.shim import format as shim_format

ErrorSink = Callable[..., None]
"""(source, message, *args): one part that could not be read (a source of
tessera.exporter.metrics.ERROR_SOURCES), a %-format message naming it."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    limits: list[shim_format.GpuLimit]
    region: shim_format.RegionSnapshot | None
    """None when the region is missing or malformed: the claim's usage is unknown, not 0."""


@dataclass(frozen=True)
class Placed:
    """Where the kernel puts a process: its container, and the IDs its cgroup names."""

    ref: ContainerRef
    pod_uid: str
    container_id: str


_Fixed = tuple[tuple[str, str, str], list[shim_format.GpuLimit], Path]
"""What never changes about a prepared claim: (namespace, name, UID), limits, region path."""


class ClaimReader:
    """The prepared claims under ``claims_dir``, each with its usage region read now."""

    def __init__(self, claims_dir: Path, on_error: ErrorSink) -> None:
        self._dir = claims_dir
        self._error = on_error
        self._fixed: dict[str, _Fixed] = {}
        """Claim UID -> (identity, limits, region path), read the first time the claim is found."""

    def claims(self) -> list[Claim]:
        out = []
        try:
            with os.scandir(self._dir) as entries:
                present = {e.name for e in entries if e.is_dir() and not e.name.startswith(".")}
        except FileNotFoundError:
            present = set()
        for uid in set(self._fixed) - present:  # unprepared: forget it
            del self._fixed[uid]
        for uid in sorted(present):
            fixed = self._fixed.get(uid) or self._read_fixed(uid, claim_files.claim_files(self._dir, uid))
            if fixed is None:
                continue
            (namespace, name, _), limits, region_path = fixed
            region: shim_format.RegionSnapshot | None = None
            try:
                region = shim_format.read_region(region_path)
            except FileNotFoundError:
                # Prepare writes it after the limits (a container cannot remove its mount point);
                # a folder gone since the listing is a claim unprepared now.
                if not region_path.parent.exists():
                    continue
            except OSError as error:  # RegionError: whatever a tenant made of the file
                self._error("region", "claim %s/%s (%s): %s", namespace, name, uid, error)
            out.append(Claim(namespace, name, uid, limits, region))
        return out

    def _read_fixed(self, uid: str, files: claim_files.ClaimFiles) -> _Fixed | None:
        """A claim's identity and limits, read once: both are written at prepare from the claim's
        allocation, which never changes, and a new claim is a new UID (a new folder)."""
        identity = claim_files.read_identity(files)
        if identity is None:
            # A folder being written or removed right now: skip without calling it an error
            # unless its files are there and unreadable.
            if files.identity.exists():
                self._error("claim", "claim %s: unreadable %s", uid, files.identity)
            return None
        try:
            limits = shim_format.read_limits(files.limits)
        except (shim_format.LimitsError, OSError) as error:
            self._error("limits", "claim %s: %s", uid, error)
            return None
        if limits is None:
            return None  # prepare has not written it yet
        self._fixed[uid] = (identity, limits, files.region)
        return self._fixed[uid]


def owners(
    proc: Path, pids: Iterable[int], container: Callable[[str, str], ContainerRef | None]
) -> dict[int, Placed]:
    """Host processes ``pids`` -> the container each runs in, by its cgroup (processes in no known
    container left out). Read each time: a pid's cgroup is one small file, and a cached answer
    could outlive the process that gave it."""
    out: dict[int, Placed] = {}
    for pid in set(pids):
        found = cgroups.container_of(proc, pid)
        ref = container(*found) if found is not None else None
        if found is not None and ref is not None:
            out[pid] = Placed(ref, *found)
    return out
