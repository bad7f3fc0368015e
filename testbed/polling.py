"""Waiting for a condition with a deadline: the one polling loop every part of the test bed uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Fatal(Exception):
    """Raised by a check to stop polling at once (the thing waited for can no longer happen)."""


def poll_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Call check() until it returns a truthy value and return that value.

    Ordinary exceptions from check() count as "not yet" (a server still starting refuses
    connections); Fatal stops at once. On timeout, the last exception is chained for context.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Fatal:
            raise
        except Exception as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}") from last_error
        time.sleep(interval)
