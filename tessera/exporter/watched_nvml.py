"""The exporter's NVML calls, each under the watchdog (tessera/watchdog.py) with one key per GPU.

A GPU whose NVML call hangs (a wedged driver) must cost only its own series: its figures are left
out of each scrape (counted as an ``nvml`` error), it reads unhealthy, and the bypass loop skips
it, while every other GPU's calls go on. At most one thread per GPU is ever stuck, so scrapes
never pile threads up. A call that stays hung past ``restart_after`` seconds fails the exporter's
liveness: the kubelet then restarts the container, and a fresh process gets a fresh NVML.

Discovery is watched the same way, one GPU at a time: a GPU whose NVML hangs at start (one that
a restart did not cure) is left out, and the others are served. Its hang does not fail liveness, as
another restart would find it hung again, over and over; once it answers it is asked again and
joins the GPUs served, in this process (``gpus``), with no restart.

NVML's initialisation and its GPU count concern every GPU at once: when either has not returned
within the restart bound, nothing can be served, and start fails with :class:`NvmlNotAnswering`
(the process exits 1 with that sentence and the kubelet restarts it, with its back-off) instead of
hanging until the startup probe gives up minutes later with no word of why.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from tessera.driver.discovery import Gpu, GpuSample
from tessera.watchdog import Hung, Watchdog

log = logging.getLogger(__name__)

T = TypeVar("T")


class NvmlNotAnswering(RuntimeError):
    """NVML's initialisation or its GPU count has not returned within the restart bound."""


def initialised(init: Callable[[], T], restart_after: float) -> T:
    """``init()`` (NVML's initialisation), waited for at most ``restart_after`` seconds."""
    try:
        return Watchdog(restart_after, "nvml-init").call("init", init)
    except Hung:
        raise NvmlNotAnswering(_not_answering("initialise", restart_after)) from None


def _not_answering(what: str, bound: float) -> str:
    return (
        f"NVML did not {what} within {bound:g} s (--nvml-restart-after): the driver does not answer,"
        " and no GPU can be served; exiting, so that the kubelet restarts the exporter"
    )


class NvmlQueries(Protocol):
    """The part of tessera.driver.discovery.Nvml the exporter asks about each GPU."""

    def sample(self, uuid: str) -> GpuSample: ...
    def problem(self, uuid: str) -> str | None: ...
    def compute_memory(self, uuid: str) -> dict[int, int | None] | None: ...
    def gpu_count(self) -> int: ...
    def gpu_at(self, index: int) -> Gpu: ...


class WatchedNvml:
    """``nvml``'s per-GPU queries, each waited for at most ``timeout`` seconds."""

    def __init__(
        self,
        nvml: NvmlQueries,
        timeout: float,
        restart_after: float,
        select: Callable[[Sequence[Gpu]], list[Gpu]] = list,
    ) -> None:
        if not restart_after >= timeout:
            raise ValueError(
                f"the NVML restart bound ({restart_after:g} s) must be at least its timeout ({timeout:g} s)"
            )
        self._nvml = nvml
        self._select = select
        """Which of the GPUs found are served (the exporter leaves out GPUs in MIG mode)."""
        self._gpus: list[Gpu] = []
        self._left_out: dict[str, int] = {}
        """Watchdog key -> NVML index, of each GPU whose discovery hung and has not joined since."""
        self._watchdog = Watchdog(timeout, "nvml-call")
        self._restart_after = restart_after
        self._lock = threading.Lock()
        self._said_hung: set[str] = set()
        """GPUs whose hang is logged: once when it starts, once when NVML answers again."""

    def discover(self) -> None:
        """Find every GPU NVML lists, each under the watchdog (the module says why one that hangs is
        left out, and why a count that hangs raises :class:`NvmlNotAnswering`). Call once, before
        any other method."""
        try:
            count = Watchdog(self._restart_after, "nvml-count").call("count", self._nvml.gpu_count)
        except Hung:
            raise NvmlNotAnswering(_not_answering("count the GPUs", self._restart_after)) from None
        found = []
        for index in range(count):
            key = f"at NVML index {index}"
            try:
                found.append(self._watchdog.call(key, functools.partial(self._nvml.gpu_at, index)))
            except Hung as hung:
                self._left_out[key] = index
                log.error(
                    "GPU %s: %s at start; serving the other GPUs without it until it answers", key, hung
                )
        self._gpus = self._select(found)

    def gpus(self) -> list[Gpu]:
        """The GPUs served now: those found at start, and any left out then that answers now."""
        with self._lock:
            answered = {
                key: index for key, index in self._left_out.items() if key not in self._watchdog.hung_for()
            }
            for key in answered:
                del self._left_out[key]
        late = []
        for key, index in answered.items():
            try:
                late.append(self._watchdog.call(key, functools.partial(self._nvml.gpu_at, index)))
            except Exception as error:  # hung again, or lost: left out until it answers
                log.warning("GPU %s answers NVML again but cannot be read yet: %s", key, error)
                with self._lock:
                    self._left_out[key] = index
        with self._lock:
            if late:
                log.info("GPU %s: NVML answers now; serving it", ", ".join(answered))
                self._gpus = sorted([*self._gpus, *self._select(late)], key=lambda gpu: gpu.index)
            return list(self._gpus)

    def sample(self, uuid: str) -> GpuSample:
        """NVML's figures for the GPU; ``Hung`` when its NVML does not answer."""
        return self._call(uuid, self._nvml.sample)

    def compute_memory(self, uuid: str) -> dict[int, int | None] | None:
        """NVML's process list of the GPU; ``Hung`` when its NVML does not answer."""
        return self._call(uuid, self._nvml.compute_memory)

    def problems(self) -> Mapping[str, str]:
        """GPU UUID -> why it is unhealthy now, a GPU whose NVML does not answer included."""
        out = {}
        for gpu in self.gpus():
            try:
                problem = self._call(gpu.uuid, self._nvml.problem)
            except Hung as hung:
                problem = str(hung)
            if problem is not None:
                out[gpu.uuid] = problem
        return out

    def _call(self, uuid: str, query: Callable[[str], T]) -> T:
        try:
            result = self._watchdog.call(uuid, lambda: query(uuid))
        except Hung as hung:
            with self._lock:
                first = uuid not in self._said_hung
                self._said_hung.add(uuid)
            if first:
                log.error("GPU %s: %s; leaving it out of scrapes and checks until it does", uuid, hung)
            raise
        with self._lock:
            back = uuid in self._said_hung
            self._said_hung.discard(uuid)
        if back:
            log.info("GPU %s: NVML answers again", uuid)
        return result

    def hung(self) -> int:
        """GPUs whose NVML call has not returned within the timeout, now."""
        return len(self._watchdog.hung_for())

    def alive(self) -> tuple[bool, str]:
        """Liveness: false once an NVML call on a GPU served has been hung for longer than
        ``restart_after`` (a GPU hung since start is not one: the module says why)."""
        with self._lock:
            left_out = set(self._left_out)
        overdue = {
            key: s
            for key, s in self._watchdog.hung_for().items()
            if s > self._restart_after and key not in left_out
        }
        if not overdue:
            return True, "ok"
        named = ", ".join(f"{key} ({seconds:.0f} s)" for key, seconds in sorted(overdue.items(), key=str))
        return (
            False,
            f"an NVML call has not returned for over {self._restart_after:g} s on GPU {named}",
        )
