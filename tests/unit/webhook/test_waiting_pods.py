"""What the webhook's look at waiting pods reads from a pod and writes into an Event: when the
scheduler gave up on it, a message within an Event's bound, and one name per pod and message
whichever replica computes it. The look itself runs against the real API server and scheduler in
tests/integration/test_kubectl_tessera.py."""

from __future__ import annotations

import datetime
import re
from typing import Any

from tessera.kubectl.why import Verdict, waiting_since
from tessera.webhook.waiting_pods import MESSAGE_LIMIT, event_name, in_turn, message_of

SINCE = "2026-12-03T10:00:00Z"


def pod(node: str = "", conditions: list[dict[str, Any]] | None = None, name: str = "p") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1"},
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": conditions or []},
    }


def unschedulable(reason: str = "Unschedulable", status: str = "False") -> dict[str, Any]:
    return {"type": "PodScheduled", "status": status, "reason": reason, "lastTransitionTime": SINCE}


def test_a_pod_waits_from_when_the_scheduler_called_it_unschedulable() -> None:
    assert waiting_since(pod(conditions=[unschedulable()])) == datetime.datetime(
        2026, 12, 3, 10, tzinfo=datetime.UTC
    )


def test_a_placed_pod_or_one_not_called_unschedulable_does_not_wait() -> None:
    assert waiting_since(pod(node="n", conditions=[unschedulable()])) is None
    assert waiting_since(pod(conditions=[unschedulable(reason="SchedulerError")])) is None
    assert waiting_since(pod(conditions=[unschedulable(status="True")])) is None
    assert waiting_since(pod()) is None


def test_an_unreadable_condition_time_is_not_waiting() -> None:
    for written in ("yesterday", "2026-12-03T10:00:00", "", None):
        condition = {**unschedulable(), "lastTransitionTime": written}
        assert waiting_since(pod(conditions=[condition])) is None, written


def test_the_message_is_the_reasons_in_order_and_bounded() -> None:
    assert message_of(Verdict(False, ["a", "b"])) == "waits for a GPU share: a; b"
    long = message_of(Verdict(False, ["x" * 5000]))
    assert len(long) <= MESSAGE_LIMIT and long.endswith("chars)")


def test_what_the_pods_author_wrote_reaches_the_message_escaped_and_bounded() -> None:
    message = message_of(Verdict(False, ["no GPU's product contains '\x1b[2J\u202eevil'"]))
    assert message == "waits for a GPU share: no GPU's product contains '\\x1b[2J\\u202eevil'"
    flood = message_of(Verdict(False, ["\x1b" * 5000]))
    assert "\x1b" not in flood and len(flood) <= MESSAGE_LIMIT


def test_one_name_per_pod_and_message_valid_and_bounded() -> None:
    name = event_name(pod(), "m")
    assert name == event_name(pod(), "m") and name != event_name(pod(), "n")
    longest = event_name(pod(name="a" * 253), "m")
    assert len(longest) <= 253
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", longest)


def test_pods_not_yet_told_are_judged_first_each_group_in_its_order() -> None:
    due = [{"metadata": {"uid": uid}} for uid in ("a", "b", "c", "d")]
    assert [p["metadata"]["uid"] for p in in_turn(due, {"a": "m", "c": "m"})] == ["b", "d", "a", "c"]
