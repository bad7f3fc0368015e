"""The limits file and the usage region, through the shim's own C code (cffi).

The driver writes a claim's limits with :func:`write_limits`, creates its usage region with
:func:`create_region` and each shared GPU's priority board with :func:`create_board`; the
exporter and the tests read usage with :func:`read_region`, a private copy of the file that
nothing its tenants write into it can turn into a fault.
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
PRIORITY_ENV = "TESSERA_PRIORITY_DIR"
PRIORITY_HIGH: int = _lib.TESSERA_PRIORITY_HIGH
PRIORITY_LOW: int = _lib.TESSERA_PRIORITY_LOW
BOARD_MAX_AHEAD_NS: int = _lib.TESSERA_BOARD_MAX_AHEAD_NS
"""How far past its heartbeat a board's busy-until is believed."""
BOARD_LINGER_NS: int = _lib.TESSERA_BOARD_LINGER_NS
"""How long after a high-priority kernel should end low-priority launches still hold back."""
LOG_ENV = "TESSERA_SHIM_LOG"
MAX_GPUS: int = _lib.TESSERA_MAX_GPUS
REGION_SLOTS: int = _lib.TESSERA_REGION_SLOTS
"""How many processes of one claim can hold memory at once (one slot each)."""
EXIT_BAD_LIMITS: int = _lib.TESSERA_EXIT_BAD_LIMITS
_NO_LIMIT = (1 << 64) - 1


class LimitsError(ValueError):
    """A limits file or limits value the shim would refuse."""


class RegionError(OSError):
    """A usage region that cannot be created, or read as a well-formed region."""


@dataclass(frozen=True)
class GpuLimit:
    """One GPU's limits for a claim. ``memory_bytes=None``: no memory limit; ``cores`` 0 or 100:
    no compute cap; ``priority`` :data:`PRIORITY_HIGH` (0) or :data:`PRIORITY_LOW` (1, HAMi's
    default)."""

    uuid: str
    memory_bytes: int | None
    cores: int = 0
    priority: int = PRIORITY_LOW


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
        if g.priority not in (PRIORITY_HIGH, PRIORITY_LOW):
            raise LimitsError(f"{g.uuid}: priority must be 0 (high) or 1 (low)")
        c.gpus[i].uuid = uuid
        c.gpus[i].memory_bytes = _NO_LIMIT if g.memory_bytes is None else g.memory_bytes
        c.gpus[i].cores = g.cores
        c.gpus[i].priority = g.priority
    c.count = len(items)
    return c


def _from_c(c: Any) -> list[GpuLimit]:
    out = []
    for i in range(c.count):
        g = c.gpus[i]
        memory = None if g.memory_bytes == _NO_LIMIT else int(g.memory_bytes)
        out.append(GpuLimit(_ffi.string(g.uuid).decode(), memory, int(g.cores), int(g.priority)))
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


def create_board(path: Path) -> Path:
    """Create a GPU's priority board (read by every shared container on that GPU, written by the
    high-priority ones) if nothing is there; an existing one is kept as it is, since containers
    have it mounted (a high-priority launch rewrites one that was scribbled on). Idempotent."""
    err = _err()
    if _lib.tessera_board_create(str(path).encode(), err, 600) != 0:
        raise RegionError(_ffi.string(err).decode())
    return path


@dataclass(frozen=True)
class Board:
    """What a priority board says (times on CLOCK_MONOTONIC, ns)."""

    heartbeat_ns: int
    busy_until_ns: int
    high_launches: int
    hold_until_ns: int
    """Until when a low-priority launch would hold back, read now; 0: it would not."""


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns, the clock of boards and regions."""
    return int(_lib.tessera_now_ns())


def read_board(path: Path) -> Board | None:
    """The board at ``path`` as a low-priority shim reads it; None if it does not read as one."""
    board = _ffi.new("struct tessera_priority_board *")
    with path.open("rb") as f:
        if _lib.tessera_board_read(f.fileno(), board) != 0:
            return None
        now = _lib.tessera_now_ns()
    return Board(
        int(board.heartbeat_ns),
        int(board.busy_until_ns),
        int(board.high_launches),
        int(_lib.tessera_board_hold_until(board, now)),
    )


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
    held_ns: int = 0
    """Time the claim's low-priority launches have waited for a high-priority neighbour."""
    holds: int = 0
    """Launches that waited so."""


@dataclass(frozen=True)
class RegionSnapshot:
    gpus: list[GpuUsage] = field(default_factory=list)
    processes: list[ProcessUsage] = field(default_factory=list)


def read_region(path: Path, include_dead: bool = False) -> RegionSnapshot:
    """What a claim's usage region says now, read from a private copy (``tessera_region_read``:
    pread, never a mapping, never a write), so whatever the claim's containers do to the file can
    only make this call raise :class:`RegionError` for that claim.

    The claim's usage counts live processes only: a slot whose owner has died (its slot lock is
    free) is left out, as the shim's own next sweep would free it. ``include_dead`` keeps such
    slots, to see the region exactly as the processes left it. FileNotFoundError if ``path`` does
    not exist; :class:`RegionError` for anything that is not a well-formed region."""
    view = _ffi.new("struct tessera_region_view *")
    err = _err()
    rc = _lib.tessera_region_read(str(path).encode(), view, err, 600)
    if rc == 1:
        raise FileNotFoundError(f"{path}: no usage region")
    if rc != 0:
        raise RegionError(_ffi.string(err).decode(errors="replace"))
    r = view.region
    # The reader checked every state and that each READY entry's UUID ends inside its field.
    gpus: list[tuple[int, str]] = [
        (g, _ffi.string(r.gpus[g].uuid).decode(errors="replace"))
        for g in range(MAX_GPUS)
        if r.gpus[g].state == _lib.TESSERA_GPU_READY
    ]
    counted = [
        i
        for i in range(int(r.slot_hwm))
        if r.slots[i].state == _lib.TESSERA_SLOT_ACTIVE and (include_dead or view.live[i])
    ]
    usage = []
    for g, uuid in gpus:
        # Each slot's bytes are below 2**64; their sum is a Python int, exact however large.
        used = sum(int(r.slots[i].used[g]) for i in counted)
        usage.append(
            GpuUsage(
                uuid,
                used,
                int(r.gpus[g].charged_ns),
                int(r.gpus[g].throttled_ns),
                int(r.gpus[g].launches),
                int(r.gpus[g].held_ns),
                int(r.gpus[g].holds),
            )
        )
    processes = [
        ProcessUsage(
            int(r.slots[i].pid),
            int(r.slots[i].start_time),
            {uuid: int(r.slots[i].used[g]) for g, uuid in gpus},
        )
        for i in counted
    ]
    return RegionSnapshot(usage, processes)
