"""Which processes took GPU memory around the shim, by the driver's own count: the rule the bypass
loop (tessera/exporter/bypass_loop.py) acts on, kept free of I/O so it is tested on fake readings.

The driver counts every byte a process holds (NVML's per-process list); the shim charges what passes
through it in the claim's usage region, one slot per process. For each claim and each GPU it has a
share of, at each check:

- **uncharged**: a process of the claim's containers holding more on the GPU than its own region
  slot charges it, by more than the tolerance. Its memory went around the shim (the real driver
  library opened by its path, the preload dropped) or its charge was erased (the claim's counters
  zeroed, so that a second process could allocate again). A process with no slot is charged 0;
  a claim whose region cannot be read (missing or malformed: a starting process's shim refuses it,
  so only a tenant's hand makes it so under running ones) charges every process 0.
- **over_limit**: the claim's processes together hold more than its limit, by more than the
  tolerance for each of them. The uncharged ones are offenders first; if the rest still hold more
  than the limit, the process with the most uncharged memory (then the most memory) is added, and
  so on until the rest fit. So well-behaved processes - whose memory the region charges - survive
  wherever the memory past the limit can be laid at other processes' door.

The tolerance is per process: on a real GPU the driver counts each process's context (a few
hundred MiB), which the shim does not charge; the simulated driver has none. A slot is a process's
when it records the process's pid as its own PID namespace numbers it (the last NSpid) and, where
both are known, the same start time (field 22 of /proc/<pid>/stat), so two pods sharing a claim
cannot be confused by equal pids.

A process of a claim's container holding memory on a GPU none of its container's claims has a share
of is judged there too, against a limit and a charge of 0: the shim gives such a GPU nothing (so the
memory went around it), and the GPU's own shares belong to others. Processes in no container of a
claim are not judged here (the collector logs them): the node may run other GPU work the exporter
knows nothing of.

An offence counts once it has held at every check for ``bound`` seconds (:class:`Episodes`), so
the transient gap between an allocation and its charge - or between the two reads - never counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tessera.exporter.reading import Placed
from tessera.quantity import MiB
from tessera.shim.format import ProcessUsage

UNCHARGED = "uncharged"
OVER_LIMIT = "over_limit"
REASONS = (UNCHARGED, OVER_LIMIT)


@dataclass(frozen=True)
class Process:
    """A process of a claim's container with a context on one GPU, as the check found it."""

    pid: int
    """As the host (and the exporter, in the host's PID namespace) numbers it; NVML's pid."""
    start_time: int
    """Field 22 of /proc/<pid>/stat (0: unknown): with pid, names the process across pid reuse."""
    ns_pid: int | None
    """As its own PID namespace numbers it (the pid its region slot records); None: unknown."""
    command: str
    placed: Placed
    driver_bytes: int
    """What the driver says the process holds on the GPU."""


@dataclass(frozen=True)
class Holding:
    """One claim's processes on one GPU at one check."""

    namespace: str
    claim: str
    claim_uid: str
    uuid: str
    limit_bytes: int
    processes: Sequence[Process]
    slots: Sequence[ProcessUsage] | None
    """The claim's live region slots; None when the region cannot be read."""
    shared: bool = True
    """False: a GPU none of the processes' claims has a share of (limit 0, nothing charged)."""

    def charged(self, process: Process) -> int:
        """What the region charges ``process`` on this GPU (its slots', normally one)."""
        if self.slots is None or process.ns_pid is None or not self.shared:
            return 0
        return sum(
            slot.used_bytes.get(self.uuid, 0)
            for slot in self.slots
            if slot.pid == process.ns_pid
            and (slot.start_time == 0 or process.start_time == 0 or slot.start_time == process.start_time)
        )


@dataclass(frozen=True)
class Offence:
    reason: str
    holding: Holding
    process: Process
    held: int
    """Bytes measured: the process's (uncharged) or the claim's processes' together (over_limit)."""
    allowed: int
    """What ``held`` is measured against: the process's charge, or the claim's limit."""

    @property
    def key(self) -> tuple[str, str, int, int]:
        """One process on one GPU for one claim: an episode's identity, whichever rule names it."""
        return (self.holding.claim_uid, self.holding.uuid, self.process.pid, self.process.start_time)

    def sentence(self, seconds: float, outcome: str) -> str:
        """One sentence for the pod's Event and the log: which process, how much past what, for
        how long, and ``outcome`` ("stopped", "reported only")."""
        p, h = self.process, self.holding
        if not h.shared:
            what = f"{_mib(self.held)} on GPU {h.uuid}, which claim {h.namespace}/{h.claim} has no share of"
        elif self.reason == UNCHARGED:
            what = (
                f"{_mib(self.held)} on GPU {h.uuid}, {_mib(self.held - self.allowed)} past what claim "
                f"{h.namespace}/{h.claim}'s usage region charges it ({_mib(self.allowed)})"
            )
        else:
            what = (
                f"{_mib(p.driver_bytes)} on GPU {h.uuid}, where claim {h.namespace}/{h.claim}'s "
                f"processes held {_mib(self.held)}, {_mib(self.held - self.allowed)} past its limit of "
                f"{_mib(self.allowed)}"
            )
        return (
            f"Process {p.pid} ({p.command}) of container {p.placed.ref.container} held {what}, "
            f"for {seconds:.1f} s: {outcome}."
        )


def offences(holdings: Iterable[Holding], tolerance: int) -> list[Offence]:
    """Every process the two rules name now (each at most once: uncharged before over_limit)."""
    out: list[Offence] = []
    for h in holdings:
        found = [
            Offence(UNCHARGED, h, p, p.driver_bytes, h.charged(p))
            for p in h.processes
            if p.driver_bytes - h.charged(p) > tolerance
        ]
        total = sum(p.driver_bytes for p in h.processes)
        if total - h.limit_bytes > tolerance * len(h.processes):
            named = {o.process.pid for o in found}
            rest = sorted(
                (p for p in h.processes if p.pid not in named),
                key=lambda p: (p.driver_bytes - h.charged(p), p.driver_bytes, p.pid),
            )
            while rest and sum(p.driver_bytes for p in rest) - h.limit_bytes > tolerance * len(rest):
                found.append(Offence(OVER_LIMIT, h, rest.pop(), total, h.limit_bytes))
        out.extend(found)
    return out


@dataclass
class Episodes:
    """When each offence was first seen, and which were acted on: an offence is due once it has
    held at every check for ``bound`` seconds, and is acted on once per episode. An episode ends at
    the first check that does not find it (the process exited, was stopped, or came back within
    the tolerance); a later offence is a new episode."""

    bound: float
    _since: dict[tuple[str, str, int, int], float] = field(default_factory=dict)
    _acted: set[tuple[str, str, int, int]] = field(default_factory=set)

    def due(self, found: Iterable[Offence], now: float) -> list[tuple[Offence, float]]:
        """The offences found at this check that are due now and not yet acted on, each with how
        long it has held."""
        current = {o.key: o for o in found}
        for key in set(self._since) - set(current):
            del self._since[key]
        self._acted &= set(current)
        out = []
        for key, offence in current.items():
            since = self._since.setdefault(key, now)
            if now - since >= self.bound and key not in self._acted:
                out.append((offence, now - since))
        return out

    def acted(self, offence: Offence) -> None:
        """Done with this episode: not due again until it ends and recurs."""
        self._acted.add(offence.key)


def _mib(value: int) -> str:
    return f"{value / MiB:.0f} MiB"
