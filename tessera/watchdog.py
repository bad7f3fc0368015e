"""Calls that may hang, made under a watchdog: the one way Tessera calls NVML where a wedged driver
must not wedge the caller.

NVML can wedge: a call that neither answers nor fails (a driver stuck in the kernel). Such a call
cannot be cancelled, so each is made on a thread of its own and the caller waits at most
``timeout`` seconds for it. A call that has not returned by then is *hung*: the caller gets
``Hung`` at once, and so does every later call under the same key until the hung one returns — at
most one thread per key is ever stuck, however often callers ask. When the hung call returns, its
key is free again and the next call is made as usual.

The node daemon's health poll (tessera/driver/device_health.py) calls under one key for all GPUs;
the exporter (tessera/exporter/cli.py) under one key per GPU, so a hung GPU leaves only its own
series out and its liveness fails once a call has been hung for longer than its bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class Hung(Exception):
    """A call under ``key`` has not returned within the watchdog's timeout (it may yet return)."""

    def __init__(self, key: Hashable, timeout: float) -> None:
        super().__init__(f"NVML did not answer within {timeout:g} s")
        self.key = key


class Watchdog:
    """Runs calls on threads of their own, at most one hung call per key (the module says why)."""

    def __init__(
        self, timeout: float, name: str = "watched-call", clock: Callable[[], float] = time.monotonic
    ):
        if not timeout > 0:
            raise ValueError(f"a watchdog's timeout must be more than 0 seconds, not {timeout}")
        self.timeout = timeout
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._hung: dict[Hashable, tuple[float, threading.Event]] = {}
        """key -> (when the hung call started, set when it returns)."""

    def call(self, key: Hashable, function: Callable[[], T]) -> T:
        """``function()``'s result (or its exception); ``Hung`` when it has not returned within the
        timeout, or when an earlier call under ``key`` is still hung (no thread is started then)."""
        with self._lock:
            if key in self._hung:
                raise Hung(key, self.timeout)
        started = self._clock()
        returned = threading.Event()
        outcome: list[tuple[bool, object]] = []

        def run() -> None:
            try:
                outcome.append((True, function()))
            except BaseException as error:  # handed to the caller, whatever it is
                outcome.append((False, error))
            finally:
                with self._lock:  # under the lock: the caller sees returned, or its hung entry goes
                    returned.set()
                    entry = self._hung.get(key)
                    if entry is not None and entry[1] is returned:
                        del self._hung[key]

        threading.Thread(target=run, name=self._name, daemon=True).start()
        if not returned.wait(self.timeout):
            with self._lock:
                if not returned.is_set():
                    self._hung[key] = (started, returned)
                    raise Hung(key, self.timeout)
        ok, value = outcome[0]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value  # type: ignore[return-value]

    def hung_for(self) -> dict[Hashable, float]:
        """Each key whose call is hung now -> seconds since that call started."""
        now = self._clock()
        with self._lock:
            return {key: now - started for key, (started, _) in self._hung.items()}

    def wait_returned(self, key: Hashable, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``key``'s hung call to return; True when none is hung."""
        with self._lock:
            entry = self._hung.get(key)
        return entry is None or entry[1].wait(timeout)
