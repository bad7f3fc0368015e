"""While admitted Workloads' shares have no place the check holds every new decision; its log says
so when that set changes and when it empties, not on every pass."""

from __future__ import annotations

import logging

from tessera.admissioncheck.controller import holding_news


def test_holding_is_logged_when_the_set_of_unplaced_workloads_changes_and_when_it_empties() -> None:
    nothing: frozenset[str] = frozenset()
    first, both = frozenset({"ns/b"}), frozenset({"ns/b", "ns/a"})
    assert holding_news(nothing, nothing) is None
    assert holding_news(nothing, first) == (
        logging.WARNING,
        "GPU shares of admitted Workloads ns/b no longer fit on the free GPUs; holding the rest",
    )
    assert holding_news(first, first) is None, "the same set on the next pass is not logged again"
    level, message = holding_news(first, both) or (0, "")
    assert level == logging.WARNING and "ns/a, ns/b no longer fit" in message
    assert holding_news(both, nothing) == (
        logging.INFO,
        "the GPU shares of every admitted Workload fit again; deciding as usual",
    )
