"""The bypass loop: every ``period`` seconds, the driver's per-process memory held against each
claim's usage region and limit (the rule: tessera/exporter/bypass.py), and what is due acted on -
the process stopped (SIGKILL) or, with ``--bypass-action=report``, only reported - with a log line
and an Event on the pod, once per episode.

It runs on a thread of its own, apart from scrapes: a bypass is stopped whether or not anyone
scrapes, and a slow scrape never delays a check. It reads with the collector's code
(tessera/exporter/reading.py) but a reader of its own, and asks NVML only for each GPU's process
list. An offence is due once it held at every check for ``bound`` seconds, so from the moment a
process holds memory around the shim to its SIGKILL takes at most ``bound`` plus two periods plus
three checks' time (docs/metrics.md): seen by the first check that reads NVML after it, due at the
first check at least ``bound`` later, checks a period plus a check's time apart.

Stopping is safe against pid reuse (tessera/exporter/procs.py): the process is pinned with a pidfd,
then checked to be the one judged - in the same container's cgroup, with the same start time -
and only then signalled, through the pidfd.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tessera.driver.discovery import Gpu
from tessera.exporter import bypass, cgroups, procs, reading
from tessera.exporter.bypass import Episodes, Holding, Offence, Process
from tessera.exporter.collector import Sources
from tessera.exporter.containers import ContainerRef
from tessera.exporter.metrics import DaemonMetrics
from tessera.exporter.reading import ClaimReader, Placed

log = logging.getLogger(__name__)

STOP = "stop"
REPORT = "report"
ACTIONS = (STOP, REPORT)
STOPPED = "GpuMemoryBypassStopped"
"""The Event's reason when the process was stopped."""
DETECTED = "GpuMemoryBypassDetected"
"""The Event's reason when it was only reported (or could not be stopped)."""


@dataclass(frozen=True)
class BypassSettings:
    action: str
    """STOP or REPORT."""
    tolerance_bytes: int
    """Per process: driver memory past its charge (or its claim's limit) by at most this is no offence."""
    bound_s: float
    """How long an offence must hold, at every check, before it is acted on."""
    period_s: float
    """Seconds between checks."""


Emit = Callable[[Placed, str, str, str], None]
"""(where, type, reason, message): an Event on the pod (tessera/exporter/events.py)."""
StopProcess = Callable[[int, Callable[[], bool]], bool]
"""(host pid, still the one judged?) -> stopped (procs.kill)."""


class BypassLoop:
    """Reads, judges and acts, one check per period (``run``); ``check`` is one of them."""

    def __init__(
        self,
        sources: Sources,
        settings: BypassSettings,
        metrics: DaemonMetrics,
        emit: Emit,
        stop_process: StopProcess = procs.kill,
    ) -> None:
        self._s = sources
        self._settings = settings
        self._metrics = metrics
        self._emit = emit
        self._stop_process = stop_process
        self._reader = ClaimReader(sources.claims_dir, self._quiet_error)
        self._episodes = Episodes(settings.bound_s)
        self._known: dict[int, tuple[int, tuple[str, str] | None, procs.Identity | None]] = {}
        """Host pid -> (start time, its cgroup's pod UID and container ID, its identity), for the
        processes NVML listed at the last check."""

    def run(self, stop: threading.Event) -> None:
        """Check every period until ``stop`` is set; a check that fails is logged and the next one
        runs as usual."""
        failing: str | None = None  # logged once while it lasts, not four times a second
        while not stop.wait(self._settings.period_s):
            try:
                self.check()
            except Exception as error:
                if repr(error) != failing:
                    log.exception("bypass check failed; retrying every %g s", self._settings.period_s)
                    failing = repr(error)
            else:
                if failing is not None:
                    log.info("bypass checks work again")
                    failing = None

    def check(self) -> None:
        """One check: read, judge, act on what is due."""
        started = time.perf_counter()
        try:
            gpus = {g.uuid: g for g in self._s.gpus()}
            listed = self._listed(gpus.values())
            # After the driver's figures: an allocation charged between the two reads shows as
            # charged, not as memory around the shim.
            holdings = self._holdings(gpus, listed, self._reader.claims())
            found = bypass.offences(holdings, self._settings.tolerance_bytes)
            for offence, seconds in self._episodes.due(found, self._s.clock()):
                self._act(offence, seconds)
        finally:
            self._metrics.bypass_checks.inc()
            self._metrics.bypass_check_duration.observe(time.perf_counter() - started)

    # ------------------------------------------------------------------ reading

    def _listed(self, gpus: Iterable[Gpu]) -> dict[str, Mapping[int, int | None]]:
        """GPU UUID -> NVML's processes there and the memory each holds; a GPU NVML cannot list
        now is left out (its episodes end: no offence is acted on without fresh evidence)."""
        out: dict[str, Mapping[int, int | None]] = {}
        for gpu in gpus:
            try:
                found = (
                    self._s.processes(gpu.uuid)
                    if self._s.processes
                    else self._s.sample(gpu.uuid).compute_memory
                )
            except Exception as error:  # a lost GPU: the scrape reports and counts it
                log.debug("bypass check: GPU %s: %s", gpu.uuid, error)
                continue
            if found is not None:
                out[gpu.uuid] = found
        return out

    def _holdings(
        self,
        gpus: Mapping[str, Gpu],
        listed: Mapping[str, Mapping[int, int | None]],
        claims: list[reading.Claim],
    ) -> list[Holding]:
        whom = self._whom({pid for p in listed.values() for pid in p})
        out = []
        for claim in claims:
            containers = set(self._s.containers(claim.namespace, claim.name))
            for limit in claim.limits:
                gpu, on_gpu = gpus.get(limit.uuid), listed.get(limit.uuid)
                if gpu is None or on_gpu is None:
                    continue
                processes = []
                for pid, used in on_gpu.items():
                    # A figure the driver does not give is not judged: unknown, not 0.
                    if pid not in whom or whom[pid][0].ref not in containers or used is None:
                        continue
                    placed, found = whom[pid]
                    processes.append(
                        Process(pid, found.start_time, found.ns_pid, found.command, placed, used)
                    )
                out.append(
                    Holding(
                        claim.namespace,
                        claim.name,
                        claim.uid,
                        limit.uuid,
                        limit.memory_bytes if limit.memory_bytes is not None else gpu.memory_bytes,
                        processes,
                        claim.region.processes if claim.region is not None else None,
                    )
                )
        return out + self._outside_their_claims(listed, claims, whom)

    def _outside_their_claims(
        self,
        listed: Mapping[str, Mapping[int, int | None]],
        claims: list[reading.Claim],
        whom: Mapping[int, tuple[Placed, procs.Identity]],
    ) -> list[Holding]:
        """A holding of limit 0 for each process of a claim's container on a GPU that none of its
        container's claims has a share of (CUDA_VISIBLE_DEVICES unset and the shim left out): each
        is judged under the first of its container's claims, which the Event names."""
        theirs: dict[ContainerRef, list[reading.Claim]] = {}
        for claim in claims:
            for ref in self._s.containers(claim.namespace, claim.name):
                theirs.setdefault(ref, []).append(claim)
        out = []
        for uuid, on_gpu in listed.items():
            for pid, used in on_gpu.items():
                placed_found = whom.get(pid)
                if placed_found is None or used is None:
                    continue
                placed, found = placed_found
                mine = theirs.get(placed.ref, [])
                if not mine or any(limit.uuid == uuid for claim in mine for limit in claim.limits):
                    continue
                process = Process(pid, found.start_time, found.ns_pid, found.command, placed, used)
                claim = mine[0]
                out.append(Holding(claim.namespace, claim.name, claim.uid, uuid, 0, [process], None, False))
        return out

    def _whom(self, pids: set[int]) -> dict[int, tuple[Placed, procs.Identity]]:
        """Listed processes that run in a known container -> where, and who they are. What cannot
        change in a process's life - its cgroup's pod and container (set before it runs, and
        checked again before any signal), its namespace pid - is read once per process (a pid and
        its start time), so a check reads one /proc file per listed process; the container is
        looked up afresh each time, as pods come and go."""
        for pid in set(self._known) - pids:
            del self._known[pid]
        out = {}
        for pid in pids:
            started = procs.start_time(self._s.proc, pid)
            if started is None:  # exited
                self._known.pop(pid, None)
                continue
            known = self._known.get(pid)
            if known is None or known[0] != started:
                ids = cgroups.container_of(self._s.proc, pid)
                found = procs.identity(self._s.proc, pid) if ids is not None else None
                known = self._known[pid] = (started, ids, found)
            _, ids, found = known
            ref = self._s.container(*ids) if ids is not None else None
            if ref is not None and ids is not None and found is not None and found.start_time == started:
                out[pid] = (Placed(ref, *ids), found)
        return out

    def _quiet_error(self, source: str, message: str, *args: object) -> None:
        """The scrape counts and logs what cannot be read; four checks a second need not repeat it."""
        log.debug("bypass check: %s: " + message, source, *args)

    # ------------------------------------------------------------------ acting

    def _act(self, offence: Offence, seconds: float) -> None:
        self._episodes.acted(offence)
        process = offence.process
        if self._settings.action == REPORT:
            self._tell(offence, DETECTED, offence.sentence(seconds, "reported only (bypass action: report)"))
            self._metrics.bypass_reported[offence.reason].inc()
            return

        def still_the_one() -> bool:
            return (
                cgroups.container_of(self._s.proc, process.pid)
                == (
                    process.placed.pod_uid,
                    process.placed.container_id,
                )
                and procs.start_time(self._s.proc, process.pid) == process.start_time
            )

        try:
            stopped = self._stop_process(process.pid, still_the_one)
        except OSError as error:  # not permitted (a capability missing): say so, every episode
            self._tell(
                offence, DETECTED, offence.sentence(seconds, f"could not be stopped ({error.strerror})")
            )
            self._metrics.bypass_reported[offence.reason].inc()
            return
        if not stopped:
            log.info("process %d exited or changed before it could be stopped; nothing done", process.pid)
            return
        self._tell(offence, STOPPED, offence.sentence(seconds, "stopped (SIGKILL)"))
        self._metrics.bypass_stopped[offence.reason].inc()

    def _tell(self, offence: Offence, reason: str, message: str) -> None:
        ref = offence.process.placed.ref
        log.warning("%s on pod %s/%s: %s", reason, ref.namespace, ref.pod, message)
        self._emit(offence.process.placed, "Warning", reason, message)
