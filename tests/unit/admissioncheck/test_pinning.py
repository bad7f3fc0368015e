"""Holding PodSets to their planned node: which PodSets are held, what the Ready state carries, and
what is read back from it."""

from __future__ import annotations

from tessera.admissioncheck.fit import Placement
from tessera.admissioncheck.pinning import (
    HOSTNAME_LABEL,
    pins_from_state,
    pod_set_updates,
    selects_hostname,
    single_node_groups,
)


def placement(group: str, node: str) -> Placement:
    return Placement(group, node, (((node, "g0"), 1, 0),))


def test_only_podsets_planned_wholly_on_one_node_are_held() -> None:
    placements = [
        placement("launcher", "a"),
        placement("workers", "a"),
        placement("workers", "b"),
        placement("solo", "b"),
        placement("solo", "b"),
        Placement("no-gpu", "", ()),
    ]
    assert single_node_groups(placements) == {"launcher": "a", "solo": "b"}


def test_a_podset_whose_template_selects_a_hostname_is_left_alone() -> None:
    workload = {
        "spec": {
            "podSets": [
                {"name": "main", "template": {"spec": {"nodeSelector": {HOSTNAME_LABEL: "x"}}}},
                {"name": "other", "template": {"spec": {"nodeSelector": {"zone": "z"}}}},
            ]
        }
    }
    assert selects_hostname(workload, "main")
    assert not selects_hostname(workload, "other")
    assert not selects_hostname(workload, "missing")


def test_the_ready_state_carries_the_pins_in_a_stable_order_and_they_read_back() -> None:
    pins = {"workers": "node-b", "launcher": "node-a"}
    updates = pod_set_updates(pins)
    assert updates == [
        {"name": "launcher", "nodeSelector": {HOSTNAME_LABEL: "node-a"}},
        {"name": "workers", "nodeSelector": {HOSTNAME_LABEL: "node-b"}},
    ]
    assert pins_from_state({"state": "Ready", "podSetUpdates": updates}) == pins
    foreign = [
        {"name": "main", "annotations": {"a": "b"}},
        {"name": 3, "nodeSelector": {HOSTNAME_LABEL: "n"}},
    ]
    assert pins_from_state({"podSetUpdates": foreign}) == {}
    assert pins_from_state(None) == {}
