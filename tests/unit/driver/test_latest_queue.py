"""The claim-status queue keeps the latest item per key, holds at most its capacity, and drops what
waits when closed (tessera/driver/latest_queue.py)."""

from __future__ import annotations

import threading

import pytest

from tessera.driver.latest_queue import LatestQueue


def test_a_newer_item_replaces_the_waiting_one_for_its_key_and_keeps_its_place() -> None:
    queue: LatestQueue[str, int] = LatestQueue(10)
    queue.put("a", 1)
    queue.put("b", 1)
    queue.put("a", 2)

    assert len(queue) == 2
    assert queue.get() == ("a", 2)
    assert queue.get() == ("b", 1)


def test_past_its_capacity_the_queue_drops_the_longest_waiting_key() -> None:
    queue: LatestQueue[str, int] = LatestQueue(2)
    assert queue.put("a", 1) is None
    assert queue.put("b", 1) is None
    assert queue.put("c", 1) == "a"

    assert len(queue) == 2
    assert queue.get() == ("b", 1)
    assert queue.get() == ("c", 1)


def test_closing_drops_what_waits_and_says_how_much() -> None:
    queue: LatestQueue[str, int] = LatestQueue(10)
    queue.put("a", 1)
    queue.put("b", 1)

    assert queue.close() == 2
    assert queue.get() is None
    assert len(queue) == 0


def test_closing_wakes_a_get_that_waits_for_an_item() -> None:
    queue: LatestQueue[str, int] = LatestQueue(10)
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(queue.get()))
    waiting.start()

    queue.close()
    waiting.join(timeout=10)

    assert not waiting.is_alive()
    assert got == [None]


def test_a_closed_queue_takes_nothing() -> None:
    queue: LatestQueue[str, int] = LatestQueue(10)
    queue.close()

    assert queue.put("a", 1) is None
    assert len(queue) == 0


def test_a_queue_that_holds_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one item"):
        LatestQueue(0)
