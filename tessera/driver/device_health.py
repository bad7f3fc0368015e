"""GPU health: NVML polled for lost or failing GPUs, turned into device taints and health reports.

A GPU that stops answering NVML is tainted NoSchedule in our ResourceSlice (so no new share lands
on it; running pods are left to their owners) and reported UNHEALTHY through the kubelet's DRA
health service, with NVML's reason; both are lifted when it answers again. The health stream sends
the complete list every time (devices left out become Unknown at the kubelet).

NVML itself can wedge: a call that neither answers nor fails (a driver stuck in the kernel). The
poll therefore runs under a watchdog (tessera/watchdog.py): a poll that has not returned within
the NVML timeout makes every GPU's health unknown (reported UNKNOWN, tainted with a key of its own,
and the daemon not ready), logged once; when the stuck call returns, the next results replace that.
A hung call cannot be cancelled, so no new poll starts until it has returned.

The same poll asks NVML whether each answering GPU is in MIG mode and which instances it has: an
operator may switch a GPU into or out of MIG mode (or change its instances) while the daemon runs,
and the slice must then publish the instances instead of the GPU, or the other way round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import grpc

from tessera.driver.devices import DeviceTaint, published_names
from tessera.driver.discovery import Gpu, MigDevice
from tessera.names import UNHEALTHY_TAINT, UNMONITORED_TAINT
from tessera.proto.health.v1 import api_pb2 as v1
from tessera.proto.health.v1 import api_pb2_grpc as v1_grpc
from tessera.proto.health.v1alpha1 import api_pb2 as v1alpha1
from tessera.proto.health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from tessera.watchdog import Hung, Watchdog

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
_MESSAGE_MAX = 1024

MigLayout = Callable[[str], tuple[bool, tuple[MigDevice, ...]] | None]
"""GPU UUID -> (in MIG mode, its instances) now, or None when NVML cannot say."""


class HealthTracker:
    """The latest health of each GPU, and who to tell when it changes."""

    def __init__(self, gpus: Sequence[Gpu], pool: str, check_timeout: float) -> None:
        self._gpus = list(gpus)
        self._pool = pool
        self._problems: dict[str, str] = {}
        self._since: dict[str, str] = {}
        self._updated = int(time.time())
        self._changed = threading.Condition()
        self._version = 0
        self._unmonitored: tuple[str, str] | None = None
        self.check_timeout = check_timeout
        self.on_change: Callable[[], None] = lambda: None
        self.assessed = threading.Event()
        """Set once the GPUs' health is known, or known to be unknown (NVML did not answer)."""

    def gpus(self) -> list[Gpu]:
        """The GPUs as last seen, MIG layout included."""
        with self._changed:
            return list(self._gpus)

    def poll(self, problem_of: Callable[[str], str | None], layout_of: MigLayout | None = None) -> None:
        """Ask ``problem_of(uuid)`` for every GPU, and ``layout_of(uuid)`` for every GPU that
        answers; record and announce changes."""
        gpus = self.gpus()
        problems = {g.uuid: p for g in gpus if (p := problem_of(g.uuid)) is not None}
        laid_out = [
            g if layout_of is None or g.uuid in problems else _with_layout(g, layout_of(g.uuid)) for g in gpus
        ]
        with self._changed:
            self._updated = int(time.time())
            relaid = laid_out != self._gpus
            if relaid:
                for before, after in zip(self._gpus, laid_out, strict=True):
                    if before != after:
                        log.warning(
                            "GPU %s (%s) is %s; republishing",
                            after.index,
                            after.uuid,
                            f"in MIG mode with {len(after.mig_devices)} MIG instances"
                            if after.mig_enabled
                            else "no longer in MIG mode",
                        )
                self._gpus = laid_out
            changed = problems != self._problems or relaid
            if changed:
                now = _now()
                for uuid, problem in problems.items():
                    if uuid not in self._problems:
                        log.error("GPU %s is unhealthy: %s; tainting it", uuid, problem)
                        self._since[uuid] = now
                for uuid in set(self._problems) - set(problems):
                    log.info("GPU %s answers again; removing its taint", uuid)
                    self._since.pop(uuid, None)
                self._problems = problems
                self._version += 1
            self._changed.notify_all()
        self.assessed.set()
        if changed:
            self.on_change()

    def set_unmonitored(self, reason: str | None) -> None:
        """NVML stopped answering (``reason`` says how), or answers again (None)."""
        with self._changed:
            if (self._unmonitored is None) == (reason is None):
                return
            if reason is not None:
                log.error("%s: no GPU's health is known; tainting each %s", reason, UNMONITORED_TAINT)
                self._unmonitored = (reason, _now())
            else:
                log.info("NVML answers again; removing the %s taints", UNMONITORED_TAINT)
                self._unmonitored = None
            self._version += 1
            self._changed.notify_all()
        self.assessed.set()
        self.on_change()

    def unmonitored(self) -> str | None:
        """Why no GPU's health is known now, or None while NVML answers."""
        with self._changed:
            return self._unmonitored[0] if self._unmonitored else None

    def taints(self) -> Mapping[str, list[DeviceTaint]]:
        """GPU UUID -> the taints it carries now: unhealthy with NVML's reason, and, while NVML does
        not answer, unmonitored (every GPU)."""
        with self._changed:
            taints: dict[str, list[DeviceTaint]] = {g.uuid: [] for g in self._gpus}
            for uuid, problem in self._problems.items():
                taints.setdefault(uuid, []).append(DeviceTaint(UNHEALTHY_TAINT, problem, self._since[uuid]))
            if self._unmonitored is not None:
                reason, since = self._unmonitored
                for gpu_taints in taints.values():
                    gpu_taints.append(DeviceTaint(UNMONITORED_TAINT, reason, since))
            return taints

    def report(self, pb: Any) -> Any:
        """The complete list as ``pb``'s NodeWatchResourcesResponse."""
        with self._changed:
            devices: list[Any] = []
            for gpu in self._gpus:
                problem = self._problems.get(gpu.uuid)
                if self._unmonitored is not None:
                    health, message = pb.UNKNOWN, self._unmonitored[0]
                elif problem:
                    health, message = pb.UNHEALTHY, f"NVML: {problem}"
                else:
                    health, message = pb.HEALTHY, "NVML answers"
                devices.extend(
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=self._pool, device_name=name),
                        health=health,
                        last_updated_time=self._updated,
                        health_check_timeout_seconds=int(self.check_timeout),
                        message=message[:_MESSAGE_MAX],
                    )
                    for name in published_names(gpu)
                )
            return pb.NodeWatchResourcesResponse(devices=devices)

    def stream(self, pb: Any, active: Callable[[], bool], stop: threading.Event) -> Iterator[Any]:
        """The list now, then at every change, and at least every half check timeout (the kubelet
        marks devices Unknown when it hears nothing for that long), while both sides are alive."""
        sent_version: int | None = None
        sent_at = 0.0
        while active() and not stop.is_set():
            with self._changed:
                if sent_version == self._version:
                    self._changed.wait(timeout=1.0)
                current = self._version
            now = time.monotonic()
            if current != sent_version or now - sent_at >= self.check_timeout / 2:
                sent_version, sent_at = current, now
                yield self.report(pb)


def _with_layout(gpu: Gpu, layout: tuple[bool, tuple[MigDevice, ...]] | None) -> Gpu:
    if layout is None:  # NVML could not say: keep what was known
        return gpu
    enabled, instances = layout
    return replace(gpu, mig_enabled=enabled, mig_devices=instances)


def poll_forever(
    tracker: HealthTracker,
    problem_of: Callable[[str], str | None],
    interval: float,
    nvml_timeout: float,
    stop: threading.Event,
    layout_of: MigLayout | None = None,
) -> None:
    """Poll every ``interval`` seconds until ``stop``, each poll under the watchdog: one that has not
    returned after ``nvml_timeout`` seconds marks the GPUs unmonitored until it does."""
    watchdog = Watchdog(nvml_timeout, "nvml-health-call")
    while not stop.is_set():
        _poll_watched(tracker, problem_of, watchdog, stop, layout_of)
        stop.wait(interval)


_POLL = "health poll"
"""The watchdog's one key: a poll asks NVML about every GPU, so a hang is every GPU's."""


def _poll_watched(
    tracker: HealthTracker,
    problem_of: Callable[[str], str | None],
    watchdog: Watchdog,
    stop: threading.Event,
    layout_of: MigLayout | None,
) -> None:
    try:
        watchdog.call(_POLL, lambda: tracker.poll(problem_of, layout_of))
    except Hung as hung:
        tracker.set_unmonitored(str(hung))
        while not watchdog.wait_returned(_POLL, 1.0):
            if stop.is_set():
                return
    except Exception:
        log.exception("GPU health poll failed")
    tracker.set_unmonitored(None)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _V1:
    def __init__(self, tracker: HealthTracker, stop: threading.Event) -> None:
        self._tracker, self._stop = tracker, stop

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._tracker.stream(v1, context.is_active, self._stop)


class _V1Alpha1:
    def __init__(self, tracker: HealthTracker, stop: threading.Event) -> None:
        self._tracker, self._stop = tracker, stop

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._tracker.stream(v1alpha1, context.is_active, self._stop)


def add_to_server(server: grpc.Server, tracker: HealthTracker, stop: threading.Event) -> None:
    v1_grpc.add_DRAResourceHealthServicer_to_server(_V1(tracker, stop), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(_V1Alpha1(tracker, stop), server)
