"""HAMi's hami.io/device-cordon node annotation becomes a NoSchedule taint on exactly the GPUs of this
node it names; what cannot be honoured cordons nothing extra and is logged."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client

from tessera.driver import devices
from tessera.driver.cordon import NodeCordon, cordon_taint, parse
from tessera.gpu_request import MAX_ANNOTATION_LENGTH
from tessera.names import CORDONED_TAINT, HAMI_DEVICE_CORDON
from tests.unit.driver.driver_samples import gpu

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
ELSEWHERE = "GPU-cccccccc-0000-0000-0000-000000000000"


@pytest.mark.parametrize("value", [None, "", "  "])
def test_no_annotation_or_a_blank_one_cordons_nothing_quietly(value: str | None) -> None:
    assert parse(value) == (frozenset(), None)


def test_entries_are_trimmed_and_repeats_collapse() -> None:
    assert parse(f" {A} ,{B},{A}") == (frozenset({A, B}), None)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (f"{A},,{B}", "has an empty entry"),
        (f"{A},GPU 1", "'GPU 1', which is not a GPU UUID"),
        (f"{A},{{x}}", "which is not a GPU UUID"),
        (",".join([A] * (MAX_ANNOTATION_LENGTH // len(A) + 1)), f"longer than {MAX_ANNOTATION_LENGTH}"),
    ],
)
def test_a_value_that_breaks_the_rules_cordons_nothing_and_says_why_in_one_sentence(
    value: str, said: str
) -> None:
    uuids, problem = parse(value)
    assert uuids == frozenset()
    assert problem is not None and said in problem
    assert problem.startswith(f"annotation {HAMI_DEVICE_CORDON} ")
    assert problem.endswith("No GPU is cordoned by it.")


def test_the_cordon_taint_is_a_noschedule_taint_saying_where_it_came_from() -> None:
    device = devices.device(gpu(), [cordon_taint("2026-12-02T01:00:00Z")])
    assert device["taints"] == [
        {
            "key": CORDONED_TAINT,
            "value": "hami.io-device-cordon",
            "effect": "NoSchedule",
            "timeAdded": "2026-12-02T01:00:00Z",
        }
    ]


def _cordon() -> tuple[NodeCordon, list[int]]:
    calls: list[int] = []
    cordon = NodeCordon(client.CoreV1Api(client.ApiClient()), "node-1", lambda: [A, B])
    cordon.on_change = lambda: calls.append(1)
    return cordon, calls


def test_a_uuid_that_is_not_a_gpu_of_this_node_is_logged_with_the_nodes_gpus(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It stays in the cordon (the publisher taints only GPUs it publishes): a GPU that appears
    later with that UUID is cordoned as soon as it is published."""
    cordon, calls = _cordon()
    with caplog.at_level(logging.WARNING):
        cordon.update(f"{A},{ELSEWHERE}")
    assert set(cordon.taints()) == {A, ELSEWHERE}
    (taint,) = cordon.taints()[A]
    assert taint.key == CORDONED_TAINT and taint.since
    assert calls == [1]
    assert (
        f"names {ELSEWHERE}, not a GPU this daemon publishes on the node (its GPUs: {A}, {B})" in caplog.text
    )


def test_a_change_is_announced_once_and_the_time_a_gpu_was_cordoned_is_kept() -> None:
    cordon, calls = _cordon()
    cordon.update(A)
    first = cordon.taints()[A][0].since
    cordon.update(A)  # the same value again (a resync, another annotation changed)
    cordon.update(f" {A},{A}")  # a new value, but the same GPUs
    assert calls == [1]
    cordon.update(f"{A},{B}")
    assert calls == [1, 1]
    assert cordon.taints()[A][0].since == first
    cordon.update(None)
    assert cordon.taints() == {}
    assert calls == [1, 1, 1]


def test_a_broken_value_lifts_the_cordon_and_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    cordon, calls = _cordon()
    cordon.update(A)
    with caplog.at_level(logging.ERROR):
        cordon.update(f"{A},not a uuid")
    assert cordon.taints() == {}
    assert calls == [1, 1]
    assert "which is not a GPU UUID. No GPU is cordoned by it." in caplog.text


def test_the_watch_reads_the_annotation_from_lists_and_events_and_a_deleted_node_cordons_nothing() -> None:
    cordon, _ = _cordon()
    node = {"metadata": {"name": "node-1", "annotations": {HAMI_DEVICE_CORDON: B}}}
    cordon._on_event("SYNCED", {"items": [node]})
    assert set(cordon.taints()) == {B} and cordon.synced.is_set()
    cordon._on_event("MODIFIED", {"metadata": {"name": "node-1"}})
    assert cordon.taints() == {}
    cordon._on_event("ADDED", node)
    cordon._on_event("DELETED", node)
    assert cordon.taints() == {}
