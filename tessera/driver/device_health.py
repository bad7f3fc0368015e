"""GPU health: NVML polled for lost or failing GPUs, turned into device taints and health reports.

A GPU that stops answering NVML is tainted NoSchedule in our ResourceSlice (so no new share lands
on it; running pods are left to their owners) and reported UNHEALTHY through the kubelet's DRA
health service, with NVML's reason; both are lifted when it answers again. The health stream sends
the complete list every time (devices left out become Unknown at the kubelet).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from tessera.driver.devices import device_name
from tessera.driver.discovery import Gpu
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
        self.check_timeout = check_timeout
        self.on_change: Callable[[], None] = lambda: None

    def poll(self, problem_of: Callable[[str], str | None]) -> None:
        """Ask ``problem_of(uuid)`` for every GPU; record and announce changes."""
        problems = {g.uuid: p for g in self._gpus if (p := problem_of(g.uuid)) is not None}
        with self._changed:
            self._updated = int(time.time())
            changed = problems != self._problems
            if changed:
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
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
        if changed:
            self.on_change()

    def problems(self) -> Mapping[str, tuple[str, str]]:
        """GPU UUID -> (reason, time it became unhealthy) for every unhealthy GPU."""
        with self._changed:
            return {u: (p, self._since[u]) for u, p in self._problems.items()}

    def report(self, pb: Any) -> Any:
        """The complete list as ``pb``'s NodeWatchResourcesResponse."""
        with self._changed:
            devices = []
            for gpu in self._gpus:
                problem = self._problems.get(gpu.uuid)
                message = (f"NVML: {problem}" if problem else "NVML answers")[:_MESSAGE_MAX]
                devices.append(
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=self._pool, device_name=device_name(gpu)),
                        health=pb.UNHEALTHY if problem else pb.HEALTHY,
                        last_updated_time=self._updated,
                        health_check_timeout_seconds=int(self.check_timeout),
                        message=message,
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
    tracker: HealthTracker, problem_of: Callable[[str], str | None], interval: float, stop: threading.Event
) -> None:
    while not stop.is_set():
        try:
            tracker.poll(problem_of)
        except Exception:
            log.exception("GPU health poll failed")
        stop.wait(interval)


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
