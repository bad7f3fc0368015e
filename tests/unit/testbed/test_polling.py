"""poll_until waits for a truthy value, treats ordinary errors as "not yet" and stops on Fatal."""

from __future__ import annotations

import itertools

import pytest

from testbed.polling import Fatal, poll_until


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", "ready"])
    assert poll_until(lambda: next(values), timeout=5, what="ready", interval=0) == "ready"


def test_ordinary_errors_mean_not_yet() -> None:
    calls = itertools.count()

    def flaky() -> bool:
        if next(calls) < 3:
            raise ConnectionRefusedError("still starting")
        return True

    assert poll_until(flaky, timeout=5, what="server", interval=0) is True


def test_fatal_stops_at_once() -> None:
    calls = itertools.count()

    def doomed() -> bool:
        next(calls)
        raise Fatal("process exited")

    with pytest.raises(Fatal, match="process exited"):
        poll_until(doomed, timeout=5, what="never", interval=0)
    assert next(calls) == 1


def test_timeout_names_what_was_awaited_and_keeps_the_last_error() -> None:
    def refuses() -> bool:
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(TimeoutError, match="waiting for the API server") as raised:
        poll_until(refuses, timeout=0.05, what="the API server", interval=0.01)
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)
