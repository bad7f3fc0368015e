"""GPU health: NVML polled for lost or failing GPUs, turned into device taints and health reports.

A GPU that stops answering NVML is tainted NoSchedule in our ResourceSlice (so no new share lands
on it; running pods are left to their owners) and reported UNHEALTHY through the kubelet's DRA
health service, with NVML's reason; both are lifted when it answers again. The health stream sends
the complete list every time (devices left out become Unknown at the kubelet).

NVML itself can wedge: a call that neither answers nor fails (a driver stuck in the kernel). The
poll therefore runs on a thread of its own under a watchdog: a poll that has not returned within
the NVML timeout makes every GPU's health unknown (reported UNKNOWN, tainted with a key of its own,
and the daemon not ready), logged once; when the stuck call returns, the next results replace that.
A hung call cannot be cancelled, so no new poll starts until it has returned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from tessera.driver.devices import DeviceTaint, device_name
from tessera.driver.discovery import Gpu
from tessera.names import UNHEALTHY_TAINT, UNMONITORED_TAINT
from tessera.proto.health.v1 import api_pb2 as v1
from tessera.proto.health.v1 import api_pb2_grpc as v1_grpc
from tessera.proto.health.v1alpha1 import api_pb2 as v1alpha1
from tessera.proto.health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
_MESSAGE_MAX = 1024


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

    def poll(self, problem_of: Callable[[str], str | None]) -> None:
        """Ask ``problem_of(uuid)`` for every GPU; record and announce changes."""
        problems = {g.uuid: p for g in self._gpus if (p := problem_of(g.uuid)) is not None}
        with self._changed:
            self._updated = int(time.time())
            changed = problems != self._problems
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
            devices = []
            for gpu in self._gpus:
                problem = self._problems.get(gpu.uuid)
                if self._unmonitored is not None:
                    health, message = pb.UNKNOWN, self._unmonitored[0]
                elif problem:
                    health, message = pb.UNHEALTHY, f"NVML: {problem}"
                else:
                    health, message = pb.HEALTHY, "NVML answers"
                devices.append(
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=self._pool, device_name=device_name(gpu)),
                        health=health,
                        last_updated_time=self._updated,
                        health_check_timeout_seconds=int(self.check_timeout),
                        message=message[:_MESSAGE_MAX],
                    )
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


def poll_forever(
    tracker: HealthTracker,
    problem_of: Callable[[str], str | None],
    interval: float,
    nvml_timeout: float,
    stop: threading.Event,
) -> None:
    """Poll every ``interval`` seconds until ``stop``, each poll under the watchdog: one that has not
    returned after ``nvml_timeout`` seconds marks the GPUs unmonitored until it does."""
    while not stop.is_set():
        _poll_watched(tracker, problem_of, nvml_timeout, stop)
        stop.wait(interval)


def _poll_watched(
    tracker: HealthTracker,
    problem_of: Callable[[str], str | None],
    nvml_timeout: float,
    stop: threading.Event,
) -> None:
    returned = threading.Event()

    def poll() -> None:
        try:
            tracker.poll(problem_of)
        except Exception:
            log.exception("GPU health poll failed")
        finally:
            returned.set()

    threading.Thread(target=poll, name="nvml-health-call", daemon=True).start()
    if not returned.wait(nvml_timeout):
        tracker.set_unmonitored(f"NVML did not answer within {nvml_timeout:g} s")
        while not returned.wait(1.0):
            if stop.is_set():
                return
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
