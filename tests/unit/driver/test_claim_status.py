"""The claim-status writer writes the latest state of each claim, one write at a time, holds a
bounded backlog, and stops without waiting for an API server that does not answer."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tessera.driver.claim_status import QUEUE_CLAIMS, ClaimStatusWriter
from tessera.names import DRIVER_NAME
from tests.unit.driver.driver_samples import claim, result

GRACE_PERIOD = 60.0
"""kubeletPlugin.terminationGracePeriodSeconds: the kubelet kills a daemon still stopping past it."""


class StatusApi:
    """``patch_namespaced_resource_claim_status`` as an API server that answers only when told to
    (``answer``), or fails each write with ``failure``."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.writes: list[tuple[str, str]] = []
        """(claim name, Ready condition's status), in the order they were asked."""
        self.asked = threading.Semaphore(0)
        self.answer = threading.Event()
        self._failure = failure

    def patch_namespaced_resource_claim_status(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        self.writes.append((name, body["status"]["devices"][0]["conditions"][0]["status"]))
        self.asked.release()
        if self._failure is not None:
            raise self._failure
        self.answer.wait()


def a_claim(name: str) -> dict[str, Any]:
    return claim(result("gpu-0", "1Gi", "10"), uid=f"uid-{name}", name=name)


def test_only_the_latest_status_of_a_claim_waiting_to_be_written_is_written() -> None:
    api = StatusApi()
    writer = ClaimStatusWriter(api, DRIVER_NAME, "node-a")  # type: ignore[arg-type]
    try:
        writer.report(a_claim("first"), None)
        assert api.asked.acquire(timeout=10)  # "first" is in flight; what follows waits
        writer.report(a_claim("second"), "prepare failed")
        writer.report(a_claim("second"), None)
        api.answer.set()
        assert api.asked.acquire(timeout=10)
    finally:
        writer.close()

    assert api.writes == [("first", "True"), ("second", "True")]


def test_a_failed_write_is_logged_and_the_next_claim_is_written(caplog: pytest.LogCaptureFixture) -> None:
    api = StatusApi(failure=RuntimeError("connection refused"))
    writer = ClaimStatusWriter(api, DRIVER_NAME, "node-a")  # type: ignore[arg-type]
    try:
        writer.report(a_claim("first"), None)
        writer.report(a_claim("second"), None)
        assert api.asked.acquire(timeout=10) and api.asked.acquire(timeout=10)
    finally:
        writer.close()

    assert [name for name, _ in api.writes] == ["first", "second"]
    assert "cannot record the status of ResourceClaim ns/first: connection refused" in caplog.text


def test_past_its_capacity_the_backlog_drops_the_longest_waiting_claim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = StatusApi()
    writer = ClaimStatusWriter(api, DRIVER_NAME, "node-a", capacity=2)  # type: ignore[arg-type]
    try:
        writer.report(a_claim("in-flight"), None)
        assert api.asked.acquire(timeout=10)
        for name in ("dropped", "kept-1", "kept-2"):
            writer.report(a_claim(name), None)
        api.answer.set()
        assert api.asked.acquire(timeout=10) and api.asked.acquire(timeout=10)
    finally:
        writer.close()

    assert [name for name, _ in api.writes] == ["in-flight", "kept-1", "kept-2"]
    assert "dropped the oldest (claim UID uid-dropped)" in caplog.text


def test_stopping_with_the_api_server_away_drops_the_backlog_within_the_grace_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = StatusApi()  # never answers: the server is away, the write in flight hangs
    writer = ClaimStatusWriter(api, DRIVER_NAME, "node-a")  # type: ignore[arg-type]
    writer.report(a_claim("in-flight"), None)
    assert api.asked.acquire(timeout=10)
    for n in range(5000):  # a kubelet retrying prepares for a long outage
        writer.report(a_claim(f"claim-{n}"), None)

    closing = threading.Thread(target=writer.close)
    closing.start()
    closing.join(timeout=GRACE_PERIOD)
    api.answer.set()

    assert not closing.is_alive()
    assert [name for name, _ in api.writes] == ["in-flight"]
    assert f"stopping: {QUEUE_CLAIMS} ResourceClaim statuses were not written" in caplog.text
