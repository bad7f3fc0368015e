"""The limits file and the usage region, through the shim's own C code (cffi).

The driver writes a claim's limits with :func:`write_limits` and creates its usage region with
:func:`create_region`; the exporter reads usage through a :class:`UsageRegion` it keeps open.
The text and binary layouts are defined once, in ``shim/include/tessera_shim.h``, and parsed and
produced by the same functions the shim links, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.files import write_atomically
from tessera.shim._format import ffi, lib

_lib: Any = lib
_ffi: Any = ffi

LIMITS_ENV = "TESSERA_LIMITS_FILE"
REGION_ENV = "TESSERA_USAGE_REGION"
LOG_ENV = "TESSERA_SHIM_LOG"
MAX_GPUS: int = _lib.TESSERA_MAX_GPUS
EXIT_BAD_LIMITS: int = _lib.TESSERA_EXIT_BAD_LIMITS
_NO_LIMIT = (1 << 64) - 1


class LimitsError(ValueError):
    """A limits file or limits value the shim would refuse."""


class RegionError(OSError):
    """A usage region that cannot be created or opened."""


@dataclass(frozen=True)
class GpuLimit:
    """One GPU's limits for a claim. ``memory_bytes=None``: no memory limit; ``cores`` 0 or 100:
    no compute cap."""

    uuid: str
    memory_bytes: int | None
    cores: int = 0


def _err() -> Any:
    return _ffi.new("char[]", 600)


def _to_c(limits: Iterable[GpuLimit]) -> Any:
    c = _ffi.new("struct tessera_limits *")
    items = list(limits)
    if len(items) > MAX_GPUS:
        raise LimitsError(f"more than {MAX_GPUS} GPUs")
    for i, g in enumerate(items):
        uuid = g.uuid.encode()
        if len(uuid) >= _lib.TESSERA_UUID_MAX:
            raise LimitsError(f"{g.uuid!r} is not a GPU UUID")
        if g.memory_bytes is not None and not 0 <= g.memory_bytes < _NO_LIMIT:
            raise LimitsError(f"{g.uuid}: memory must be 0 <= bytes < 2**64 - 1")
        if not 0 <= g.cores <= 100:
            raise LimitsError(f"{g.uuid}: cores must be 0-100")
        c.gpus[i].uuid = uuid
        c.gpus[i].memory_bytes = _NO_LIMIT if g.memory_bytes is None else g.memory_bytes
        c.gpus[i].cores = g.cores
    c.count = len(items)
    return c


def _from_c(c: Any) -> list[GpuLimit]:
    out = []
    for i in range(c.count):
        g = c.gpus[i]
        memory = None if g.memory_bytes == _NO_LIMIT else int(g.memory_bytes)
        out.append(GpuLimit(_ffi.string(g.uuid).decode(), memory, int(g.cores)))
    return out


def format_limits(limits: Iterable[GpuLimit]) -> str:
    """The limits file's text for ``limits``."""
    c = _to_c(limits)
    buf = _ffi.new("char[]", _lib.TESSERA_LIMITS_MAX_BYTES)
    err = _err()
    n = _lib.tessera_limits_format(c, buf, _lib.TESSERA_LIMITS_MAX_BYTES, err, 600)
    if n < 0:
        raise LimitsError(_ffi.string(err).decode())
    return str(_ffi.unpack(buf, n).decode())


def parse_limits(text: str) -> list[GpuLimit]:
    """Parse limits-file text exactly as the shim does; :class:`LimitsError` if it would refuse it."""
    data = text.encode()
    c = _ffi.new("struct tessera_limits *")
    err = _err()
    if _lib.tessera_limits_parse(data, len(data), c, err, 600) != 0:
        raise LimitsError(_ffi.string(err).decode())
    return _from_c(c)


def read_limits(path: Path) -> list[GpuLimit] | None:
    """The limits in ``path`` as the shim reads them; None if the file does not exist."""
    c = _ffi.new("struct tessera_limits *")
    err = _err()
    rc = _lib.tessera_limits_read(str(path).encode(), c, err, 600)
    if rc < 0:
        raise LimitsError(_ffi.string(err).decode())
    return None if rc == 1 else _from_c(c)


def write_limits(path: Path, limits: Iterable[GpuLimit]) -> Path:
    """Write a limits file atomically, read-only for everyone (mode 0444). Returns ``path``."""
    return write_atomically(path, format_limits(limits), mode=0o444)


def create_region(path: Path) -> Path:
    """Create a claim's usage region (all processes of the claim map it). Idempotent."""
    err = _err()
    if _lib.tessera_region_create(str(path).encode(), err, 600) != 0:
        raise RegionError(_ffi.string(err).decode())
    return path


@dataclass(frozen=True)
class ProcessUsage:
    """A live (or not yet reaped) process of the claim."""

    pid: int
    start_time: int
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with pid, names the process."""
    used_bytes: dict[str, int]
    """Device memory held, by GPU UUID."""


@dataclass(frozen=True)
class GpuUsage:
    """The claim's use of one GPU."""

    uuid: str
    used_bytes: int
    charged_ns: int
    """GPU time the compute controller has charged the claim (monotonic)."""
    throttled_ns: int
    """Time the claim's launches have waited for budget (monotonic)."""
    launches: int


@dataclass(frozen=True)
class RegionSnapshot:
    gpus: list[GpuUsage] = field(default_factory=list)
    processes: list[ProcessUsage] = field(default_factory=list)


class UsageRegion:
    """A claim's usage region, mapped until :meth:`close`: a reader that looks again and again
    (the exporter, at every scrape) keeps one open rather than mapping the file each time.

    The region file is made once per claim and never replaced, so a mapping stays the claim's
    for as long as the claim exists. The reader holds no slot, so keeping it open takes nothing
    from the claim's processes.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = _ffi.new("struct tessera_region_handle *")
        err = _err()
        if _lib.tessera_region_open(str(path).encode(), self._handle, err, 600) != 0:
            raise RegionError(_ffi.string(err).decode())
        self._open = True

    def __enter__(self) -> UsageRegion:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Unmap the region. Safe to call twice."""
        if self._open:
            _lib.tessera_region_close(self._handle)
            self._open = False

    def snapshot(self, reap: bool = True) -> RegionSnapshot:
        """What the claim uses now. With ``reap`` (the default), dead processes' usage is released
        first, so the snapshot never counts a process that is gone."""
        if not self._open:
            raise RegionError(f"{self.path}: region closed")
        if reap:
            _lib.tessera_region_reap(self._handle)
        r = self._handle.map
        gpus: list[tuple[int, str]] = []
        for g in range(MAX_GPUS):
            if r.gpus[g].state == _lib.TESSERA_GPU_READY:
                gpus.append((g, _ffi.string(r.gpus[g].uuid).decode()))
        usage = [
            GpuUsage(
                uuid,
                int(_lib.tessera_region_used(r, g)),
                int(r.gpus[g].charged_ns),
                int(r.gpus[g].throttled_ns),
                int(r.gpus[g].launches),
            )
            for g, uuid in gpus
        ]
        processes = []
        for i in range(min(int(r.slot_hwm), _lib.TESSERA_REGION_SLOTS)):
            s = r.slots[i]
            if s.state != _lib.TESSERA_SLOT_ACTIVE:
                continue
            used = {uuid: int(s.used[g]) for g, uuid in gpus}
            processes.append(ProcessUsage(int(s.pid), int(s.start_time), used))
        return RegionSnapshot(usage, processes)


def read_region(path: Path, reap: bool = True) -> RegionSnapshot:
    """One look at a claim's usage region (see :meth:`UsageRegion.snapshot`)."""
    with UsageRegion(path) as region:
        return region.snapshot(reap)
