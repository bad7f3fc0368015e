"""A bounded work queue that keeps only the latest item per key, for writes that only their last
state matters for (a claim's Ready condition).

Why not a plain queue: with the API server away, every prepare and every kubelet retry would add a
write, and a queue of all of them grows without end and takes as long to drain as the outage lasted.
Here a newer item for a key replaces the waiting one (keeping its place in line), at most
``capacity`` keys wait (the oldest is dropped past that), and ``close`` drops whatever still waits,
so a stopping daemon owes nothing to a server that is not there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LatestQueue(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a queue holds at least one item, not {capacity}")
        self._capacity = capacity
        self._waiting: OrderedDict[K, V] = OrderedDict()
        self._changed = threading.Condition()
        self._closed = False

    def put(self, key: K, value: V) -> K | None:
        """Queue ``value`` for ``key``, replacing an item waiting for the same key; returns the key
        whose item was dropped to stay within the capacity, if one was. Closed: nothing is queued."""
        with self._changed:
            if self._closed:
                return None
            self._waiting[key] = value  # an existing key keeps its place: it has waited longest
            dropped = None
            if len(self._waiting) > self._capacity:
                dropped, _ = self._waiting.popitem(last=False)
            self._changed.notify()
            return dropped

    def get(self) -> tuple[K, V] | None:
        """The oldest waiting item, waiting for one; None once the queue is closed."""
        with self._changed:
            while not self._waiting and not self._closed:
                self._changed.wait()
            if self._closed:
                return None
            return self._waiting.popitem(last=False)

    def close(self) -> int:
        """Drop every waiting item and wake every ``get``; returns how many were dropped."""
        with self._changed:
            self._closed = True
            dropped = len(self._waiting)
            self._waiting.clear()
            self._changed.notify_all()
            return dropped

    def __len__(self) -> int:
        with self._changed:
            return len(self._waiting)
