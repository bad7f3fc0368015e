"""The health poll under its NVML watchdog: a call that neither answers nor fails makes every GPU's
health unknown (UNKNOWN to the kubelet, the unmonitored taint on every GPU, one log line); when the
call returns, the GPUs' real health replaces it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from tessera.driver.device_health import HealthTracker, poll_forever
from tessera.names import UNHEALTHY_TAINT, UNMONITORED_TAINT
from tessera.proto.health.v1 import api_pb2 as v1
from testbed.polling import poll_until
from tests.unit.driver.driver_samples import gpu

GPUS = [gpu(0), gpu(1)]


class WedgingNvml:
    """problem_of for the tracker: GPU 1 is lost; while ``wedged`` is set, every call blocks."""

    def __init__(self) -> None:
        self.wedged = threading.Event()
        self.released = threading.Event()

    def problem(self, uuid: str) -> str | None:
        if self.wedged.is_set():
            self.released.wait()
        return "GPU is lost" if uuid == GPUS[1].uuid else None


@pytest.fixture
def watched() -> Iterator[tuple[HealthTracker, WedgingNvml]]:
    tracker = HealthTracker(GPUS, "node-a", check_timeout=30)
    nvml = WedgingNvml()
    stop = threading.Event()
    thread = threading.Thread(target=poll_forever, args=(tracker, nvml.problem, 0.05, 0.3, stop), daemon=True)
    thread.start()
    yield tracker, nvml
    stop.set()
    nvml.released.set()
    thread.join(5)


def keys(tracker: HealthTracker) -> dict[str, list[str]]:
    return {uuid: [t.key for t in taints] for uuid, taints in tracker.taints().items()}


def test_a_wedged_nvml_makes_every_gpu_unknown_and_its_return_restores_the_real_health(
    watched: tuple[HealthTracker, WedgingNvml], caplog: pytest.LogCaptureFixture
) -> None:
    tracker, nvml = watched
    poll_until(lambda: tracker.assessed.is_set(), 30, "the first poll")
    assert keys(tracker) == {GPUS[0].uuid: [], GPUS[1].uuid: [UNHEALTHY_TAINT]}
    changes: list[str | None] = []
    tracker.on_change = lambda: changes.append(tracker.unmonitored())

    with caplog.at_level(logging.ERROR):
        nvml.wedged.set()
        poll_until(lambda: tracker.unmonitored() is not None, 30, "the watchdog to give up on NVML")
        assert tracker.unmonitored() == "NVML did not answer within 0.3 s"
        assert keys(tracker) == {
            GPUS[0].uuid: [UNMONITORED_TAINT],
            GPUS[1].uuid: [UNHEALTHY_TAINT, UNMONITORED_TAINT],
        }
        report = tracker.report(v1)
        assert [d.health for d in report.devices] == [v1.UNKNOWN, v1.UNKNOWN]
        assert report.devices[0].message == "NVML did not answer within 0.3 s"
        threading.Event().wait(1.0)  # several poll intervals pass while the call hangs
        said = [r.getMessage() for r in caplog.records if "NVML did not answer" in r.getMessage()]
        assert said == [
            f"NVML did not answer within 0.3 s: no GPU's health is known; tainting each {UNMONITORED_TAINT}"
        ], "logged once, not once per interval"
        assert changes == ["NVML did not answer within 0.3 s"], "the slice is republished once"

    nvml.wedged.clear()
    nvml.released.set()
    poll_until(lambda: tracker.unmonitored() is None, 30, "the watchdog to see NVML answer again")
    assert keys(tracker) == {GPUS[0].uuid: [], GPUS[1].uuid: [UNHEALTHY_TAINT]}
    assert [d.health for d in tracker.report(v1).devices] == [v1.HEALTHY, v1.UNHEALTHY]
    assert changes[-1] is None
