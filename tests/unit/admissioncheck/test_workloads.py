"""Reading a Workload's PodSets through the webhook's conversion: a Job's template with HAMi
resources, a plain pod's ResourceClaimTemplates, and what asks for no GPU."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tessera.admissioncheck.fit import Choice, Gpu, Placement, PodGroup, Request, free_capacity
from tessera.admissioncheck.inventory import PodRecord
from tessera.admissioncheck.workloads import (
    Undecidable,
    WorkloadController,
    _give_back,
    _less_placed,
    _room,
    pod_groups,
    priority_order,
    requests_from_claim_spec,
)
from tessera.quantity import GiB, MiB
from tessera.webhook.conversion import Refusal, claim_spec, read_request
from tessera.webhook.fleet import Fleet
from tessera.webhook.selectors import Selection, selection_for


def workload(podsets: list[dict[str, Any]], assigned: dict[str, int] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if assigned:
        status["admission"] = {"podSetAssignments": [{"name": n, "count": c} for n, c in assigned.items()]}
    return {"metadata": {"name": "w", "namespace": "team-a"}, "spec": {"podSets": podsets}, "status": status}


def job_podset(
    count: int, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": "main",
        "count": count,
        "template": {
            "metadata": {"annotations": annotations or {}},
            "spec": {"containers": [{"name": "train", "resources": {"limits": limits}}]},
        },
    }


def test_a_jobs_template_is_read_as_the_webhook_reads_its_pods() -> None:
    annotations = {"nvidia.com/use-gputype": "A100"}
    groups = pod_groups(
        workload([job_podset(4, {"nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "30"}, annotations)]),
        {},
        [],
    )
    choice = Choice(memory=20 * GiB, cores=30, selection=selection_for(annotations))
    assert groups == [PodGroup("main", 4, (Request(1, (choice,)),))]


def test_partial_admission_counts_the_admitted_pods() -> None:
    groups = pod_groups(workload([job_podset(8, {"nvidia.com/gpumem": "1024"})], {"main": 3}), {}, [])
    assert groups[0].count == 3


def test_a_template_without_gpu_resources_asks_for_no_share() -> None:
    groups = pod_groups(workload([job_podset(2, {"cpu": "1"})]), {}, [])
    assert groups == [PodGroup("main", 2, ())]


def test_a_request_the_webhook_would_deny_is_refused_with_its_sentence() -> None:
    with pytest.raises(Refusal, match="gpucores is 300"):
        pod_groups(workload([job_podset(1, {"nvidia.com/gpucores": "300"})]), {}, [])


def test_a_plain_pods_claim_template_reads_back_as_the_request_it_was_made_from() -> None:
    annotations = {"nvidia.com/nouse-gpuuuid": "GPU-x"}
    selection = selection_for(annotations)
    container = {
        "resources": {
            "limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "25"}
        }
    }
    request = read_request("c", container)
    assert request is not None
    spec = claim_spec("c", request, selection.cel(), Fleet((80 * GiB,), 8))
    unknown: list[str] = []
    assert requests_from_claim_spec(spec, unknown) == [
        Request(2, (Choice(memory=8192 * MiB, cores=25, selection=selection),))
    ]
    assert unknown == []


def test_a_percentage_template_reads_back_as_one_choice_per_gpu_size() -> None:
    request = read_request("c", {"resources": {"limits": {"nvidia.com/gpumem-percentage": "50"}}})
    assert request is not None
    spec = claim_spec("c", request, [], Fleet((80 * GiB, 40 * GiB), 8))
    (read,) = requests_from_claim_spec(spec, [])
    assert read.choices == (
        Choice(memory=40 * GiB, memory_size=80 * GiB),
        Choice(memory=20 * GiB, memory_size=40 * GiB),
    )


def test_a_plain_pod_whose_template_is_not_known_yet_is_undecidable() -> None:
    podset = {
        "name": "main",
        "count": 1,
        "template": {
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tessera-abc"}],
                "containers": [{"name": "c"}],
            }
        },
    }
    with pytest.raises(Undecidable):
        pod_groups(workload([podset]), {}, [])
    template = {
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.tessera.dev",
                                "count": 1,
                                "capacity": {"requests": {"memory": "4Gi"}},
                            },
                        }
                    ]
                }
            }
        }
    }
    groups = pod_groups(workload([podset]), {("team-a", "tessera-abc"): template}, [])
    assert groups == [PodGroup("main", 1, (Request(1, (Choice(memory=4 * GiB),)),))]


def test_other_device_classes_and_foreign_selectors_are_not_ours_to_judge() -> None:
    spec = {
        "devices": {
            "requests": [
                {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.tessera.dev",
                        "selectors": [{"cel": {"expression": "device.attributes['x'].y"}}],
                        "capacity": {"requests": {"memory": "1Gi"}},
                    },
                },
            ]
        }
    }
    unknown: list[str] = []
    assert requests_from_claim_spec(spec, unknown) == [
        Request(1, (Choice(memory=GiB, selection=Selection()),))
    ]
    assert unknown == ["device.attributes['x'].y"]


def test_placed_pods_leave_the_reserved_shares() -> None:
    groups = [PodGroup("main", 4, (Request(1, (Choice(memory=GiB),)),))]
    placed = [PodRecord(str(i), "ns", frozenset(), True, "") for i in range(3)]
    assert _less_placed(groups, placed) == [PodGroup("main", 1, groups[0].requests)]
    assert _less_placed(groups, [*placed, PodRecord("9", "ns", frozenset(), True, "")]) == []


def test_higher_priority_then_older_workloads_are_decided_first() -> None:
    def wl(name: str, priority: int, created: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"priority": priority}}

    order = sorted(
        [
            wl("batch-old", 100, "2026-01-01T00:00:00Z"),
            wl("prod", 1000, "2026-01-03T00:00:00Z"),
            wl("batch-new", 100, "2026-01-02T00:00:00Z"),
        ],
        key=priority_order,
    )
    assert [w["metadata"]["name"] for w in order] == ["prod", "batch-old", "batch-new"]


def test_a_kept_plan_must_still_have_room_and_giving_back_restores_it() -> None:
    free = {("p", "g0"): (10 * GiB, 100)}
    placement = Placement("main", "n", ((("p", "g0"), 6 * GiB, 10), (("p", "g0"), 6 * GiB, 10)))
    assert not _room(free, placement), "two 6Gi shares on one GPU with 10Gi free"
    single = Placement("main", "n", ((("p", "g0"), 6 * GiB, 10),))
    assert _room(free, single)
    assert _give_back({("p", "g0"): (4 * GiB, 90)}, [single]) == free


def replanner() -> WorkloadController:
    return WorkloadController(client.ApiClient(), None, "test")  # type: ignore[arg-type]


def test_reserved_shares_keep_their_planned_place_move_when_it_is_taken_and_block_when_none_is_left() -> None:
    gpus = [Gpu("n", "n", f"g{i}", f"U{i}", "A100", 40 * GiB, 100) for i in range(2)]
    group = PodGroup("main", 1, (Request(1, (Choice(memory=30 * GiB),)),))
    controller = replanner()
    first = controller._replan(gpus, free_capacity(gpus, {}), {"w1": ("ns/w1", [group])})
    (planned,) = controller._plans["w1"]
    assert first.unplanned == []
    # The scheduler put someone else's 30Gi on the planned GPU: the reserved share moves to the other.
    taken = free_capacity(gpus, {planned.shares[0][0]: (30 * GiB, 0)})
    second = controller._replan(gpus, taken, {"w1": ("ns/w1", [group])})
    (moved,) = controller._plans["w1"]
    assert moved.shares[0][0] != planned.shares[0][0] and second.unplanned == []
    # Both GPUs taken: the reserved share has no place, and the pass says whose.
    full = free_capacity(gpus, {g.key: (30 * GiB, 0) for g in gpus})
    third = controller._replan(gpus, full, {"w1": ("ns/w1", [group])})
    assert third.unplanned == ["ns/w1"]
    # A Workload no longer reserved leaves no plan behind.
    controller._replan(gpus, free_capacity(gpus, {}), {})
    assert controller._plans == {}
