"""The watchdog every NVML caller shares: a call that neither answers nor fails is given up on after
the timeout, and no further thread is started for its key until it returns."""

from __future__ import annotations

import threading

import pytest

from tessera.watchdog import Hung, Watchdog
from testbed.polling import poll_until


class Wedge:
    """A call that blocks until released, counting how often it was started."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.started = 0

    def __call__(self) -> str:
        self.started += 1
        self.released.wait()
        return "answered"


def test_a_call_that_returns_in_time_gives_its_result_and_its_exception() -> None:
    watchdog = Watchdog(5.0)
    assert watchdog.call("gpu-0", lambda: 42) == 42

    def fails() -> None:
        raise RuntimeError("GPU is lost")

    with pytest.raises(RuntimeError, match="GPU is lost"):
        watchdog.call("gpu-0", fails)
    assert watchdog.hung_for() == {}


def test_a_hung_call_raises_hung_and_later_calls_on_its_key_start_no_thread_until_it_returns() -> None:
    watchdog = Watchdog(0.2)
    wedge = Wedge()
    with pytest.raises(Hung, match=r"NVML did not answer within 0.2 s"):
        watchdog.call("gpu-0", wedge)
    for _ in range(5):
        with pytest.raises(Hung):
            watchdog.call("gpu-0", wedge)
    assert wedge.started == 1, "one stuck thread per key, however often it is asked"
    assert set(watchdog.hung_for()) == {"gpu-0"}
    assert watchdog.call("gpu-1", lambda: "other GPU") == "other GPU", "other keys go on"

    wedge.released.set()
    assert watchdog.wait_returned("gpu-0", 5.0)
    assert watchdog.hung_for() == {}
    assert watchdog.call("gpu-0", wedge) == "answered"
    assert wedge.started == 2


def test_how_long_a_call_is_hung_is_read_from_the_clock() -> None:
    now = [100.0]
    watchdog = Watchdog(0.1, clock=lambda: now[0])
    wedge = Wedge()
    with pytest.raises(Hung):
        watchdog.call("gpu-0", wedge)
    now[0] = 161.0
    assert watchdog.hung_for() == {"gpu-0": 61.0}
    wedge.released.set()
    poll_until(lambda: watchdog.hung_for() == {}, 30, "the hung call to return")


def test_a_timeout_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="more than 0 seconds"):
        Watchdog(0)
