"""Events on a pod written off the caller's thread: what each says, and that a write that fails
costs only that Event. (tests/integration/test_metrics_exporter.py reads them back from a real API
server.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tessera.exporter.containers import ContainerRef
from tessera.exporter.events import PodEvents
from tessera.exporter.reading import Placed
from testbed.polling import poll_until

PLACED = Placed(ContainerRef("team-a", "train-0", "main"), "0b5e-uid", "c" * 64)


def test_an_event_names_the_pod_by_uid_and_says_who_wrote_it() -> None:
    body = PodEvents(lambda *_: None, "node-7").body(
        PLACED, "Warning", "GpuMemoryBypassStopped", "Process 1 ..."
    )
    assert body.involved_object.model_dump(exclude_none=True) == {
        "api_version": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "train-0",
        "uid": "0b5e-uid",
    }
    assert body.metadata is not None
    assert (body.metadata.generate_name, body.metadata.namespace) == ("train-0.", "team-a")
    assert (body.type, body.reason, body.message, body.count) == (
        "Warning",
        "GpuMemoryBypassStopped",
        "Process 1 ...",
        1,
    )
    assert body.source is not None and (body.source.component, body.source.host) == (
        "tessera-exporter",
        "node-7",
    )
    assert (body.reporting_component, body.reporting_instance) == ("tessera-exporter", "node-7")


def test_a_write_that_fails_is_logged_and_the_next_one_is_still_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    written: list[tuple[str, Any]] = []

    def create(namespace: str, body: Any) -> None:
        if body.message == "first":
            raise ConnectionError("the API server is away")
        written.append((namespace, body))

    events = PodEvents(create, "node-7")
    stop = threading.Event()
    thread = threading.Thread(target=events.run, args=(stop,))
    thread.start()
    try:
        events.emit(PLACED, "Warning", "GpuMemoryBypassStopped", "first")
        events.emit(PLACED, "Warning", "GpuMemoryBypassStopped", "second")
        poll_until(lambda: written or None, 10, "the second Event written")
    finally:
        stop.set()
        thread.join(10)
    assert [(ns, body.message) for ns, body in written] == [("team-a", "second")]
    assert any(
        "could not write Event GpuMemoryBypassStopped on pod team-a/train-0: the API server is away"
        in r.getMessage()
        for r in caplog.records
    )
