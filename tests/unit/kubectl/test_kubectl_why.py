"""``kubectl tessera why``: a waiting pod judged against every GPU, one sentence per reason, from
the admission check's own readers and packing (no API server: the objects are built as the driver,
the webhook and the scheduler write them)."""

from __future__ import annotations

from typing import Any

from tessera.kubectl.why import as_data, judge
from tests.unit.kubectl.kubectl_samples import H100, gpu_slice, snapshot, used, waiting

GIB_20 = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}


def judged(
    limits: dict[str, str],
    slices: list[dict[str, Any]],
    claims: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    **more: Any,
) -> dict[str, Any]:
    template, pod = waiting("waiting", limits, annotations)
    return as_data(judge(pod, snapshot(slices, claims or [], [template], **more)))


def test_a_type_no_gpu_has_is_named_with_the_products_the_cluster_has() -> None:
    verdict = judged(GIB_20, [gpu_slice("node-a", [80])], annotations={"nvidia.com/use-gputype": "a100"})
    assert not verdict["fits"]
    assert verdict["reasons"] == [f"no GPU's product contains 'a100' (this cluster has: {H100})"]
    assert verdict["gpus"][0]["verdict"] == "not selected by the claim"


def test_a_uuid_no_gpu_has_is_named_with_the_uuids_the_cluster_has() -> None:
    verdict = judged(
        GIB_20, [gpu_slice("node-a", [80, 80])], annotations={"nvidia.com/use-gpuuuid": "GPU-nowhere"}
    )
    assert verdict["reasons"] == [
        "no GPU has UUID 'GPU-nowhere' (this cluster has: GPU-node-a-0, GPU-node-a-1)"
    ]


def test_a_share_too_big_for_every_gpus_remaining_memory_names_each_gpus_free_memory() -> None:
    claims = [used("node-a", 0, "68Gi", "a0"), used("node-b", 0, "70Gi", "b0")]
    verdict = judged(GIB_20, [gpu_slice("node-a", [80]), gpu_slice("node-b", [80])], claims)
    assert not verdict["fits"]
    assert verdict["reasons"] == [
        "no GPU the claim may use has room: GPU-node-a-0 on node-a has 12Gi free, the claim asks 20Gi; "
        "GPU-node-b-0 on node-b has 10Gi free, the claim asks 20Gi"
    ]


def test_cores_are_judged_as_well_as_memory() -> None:
    claims = [used("node-a", 0, "1Gi", "a0", cores="90")]
    verdict = judged({**GIB_20, "nvidia.com/gpucores": "30"}, [gpu_slice("node-a", [80])], claims)
    assert verdict["reasons"] == [
        "no GPU the claim may use has room: GPU-node-a-0 on node-a has 10 cores free, the claim asks 30"
    ]


def test_when_every_gpu_with_room_is_cordoned_the_reason_says_so() -> None:
    slices = [gpu_slice("node-a", [80, 80], cordoned=[1]), gpu_slice("node-b", [80], cordoned=[0])]
    claims = [used("node-a", 0, "70Gi", "a0")]
    verdict = judged(GIB_20, slices, claims)
    assert verdict["reasons"] == [
        "every GPU that fits is cordoned: GPU-node-a-1 on node-a (gpu.tessera.dev/cordoned), "
        "GPU-node-b-0 on node-b (gpu.tessera.dev/cordoned)"
    ]


def test_a_device_taint_rule_and_a_cordoned_node_count_as_cordons() -> None:
    rule = {
        "metadata": {"name": "maintenance"},
        "spec": {
            "deviceSelector": {"driver": "gpu.tessera.dev", "pool": "node-a"},
            "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
        },
    }
    node_b = {"metadata": {"name": "node-b"}, "spec": {"unschedulable": True}}
    verdict = judged(
        GIB_20, [gpu_slice("node-a", [80]), gpu_slice("node-b", [80])], taint_rules=[rule], nodes=[node_b]
    )
    assert verdict["reasons"] == [
        "every GPU that fits is cordoned: GPU-node-a-0 on node-a (example.com/maintenance), "
        "GPU-node-b-0 on node-b (node cordoned)"
    ]


def test_two_distinct_gpus_asked_where_no_node_has_two_with_room() -> None:
    slices = [gpu_slice("node-a", [80, 80]), gpu_slice("node-b", [80])]
    claims = [used("node-a", 1, "75Gi", "a1")]
    verdict = judged({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20480"}, slices, claims)
    assert not verdict["fits"]
    assert verdict["reasons"] == [
        "the claim asks for 2 different GPUs on one node, and no node has 2 GPUs with room: "
        "node-a has 1 (GPU-node-a-0), node-b has 1 (GPU-node-b-0)"
    ]


def test_a_pod_whose_shares_fit_is_told_the_wait_is_not_its_gpu_shares() -> None:
    verdict = judged(GIB_20, [gpu_slice("node-a", [80])])
    assert verdict["fits"]
    assert verdict["reasons"][0].startswith("its GPU shares fit now (on node-a)")
    assert verdict["gpus"][0]["verdict"] == "has room for its shares"


def test_shares_of_other_pods_are_counted_on_the_gpu_they_hold() -> None:
    claims = [used("node-a", 0, "60Gi", "a0", pod="neighbour")]
    fits = judged({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}, [gpu_slice("node-a", [80])], claims)
    too_big = judged(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20481"}, [gpu_slice("node-a", [80])], claims
    )
    assert fits["fits"] and not too_big["fits"]
    assert too_big["gpus"][0]["freeMemory"] == 20 * 1024**3


def test_shares_that_fit_one_by_one_but_not_together_get_the_admission_checks_sentence() -> None:
    # Two claims of 50Gi each: each fits on either of the two 60Gi-free GPUs, on different nodes,
    # but a pod's shares all go to one node.
    template, pod = waiting("waiting", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "51200"})
    first = pod["spec"]["resourceClaims"][0]
    pod["spec"]["resourceClaims"].append(dict(first, name="second"))
    claims = [used("node-a", 0, "20Gi", "a0"), used("node-b", 0, "20Gi", "b0")]
    verdict = as_data(
        judge(pod, snapshot([gpu_slice("node-a", [80]), gpu_slice("node-b", [80])], claims, [template]))
    )
    assert not verdict["fits"]
    assert verdict["reasons"][0].startswith(
        "needs 2 shares of 50Gi at once; the largest free share is 60Gi/90"
    )


def test_a_placed_pod_is_not_judged() -> None:
    template, pod = waiting("placed", GIB_20)
    pod["spec"]["nodeName"] = "node-a"
    verdict = as_data(judge(pod, snapshot([gpu_slice("node-a", [80])], [], [template])))
    assert verdict == {
        "fits": True,
        "reasons": ["it is placed on node node-a; nothing keeps it waiting for a GPU"],
        "gpus": [],
    }


def test_a_template_not_found_is_said_and_nothing_else_is_guessed() -> None:
    _, pod = waiting("orphan", GIB_20)
    verdict = as_data(judge(pod, snapshot([gpu_slice("node-a", [80])])))
    assert not verdict["fits"]
    assert verdict["reasons"] == [
        f"its GPU request cannot be read yet: ResourceClaimTemplate team/"
        f"{pod['spec']['resourceClaims'][0]['resourceClaimTemplateName']} is not known yet"
    ]


def test_a_cluster_without_gpus_is_named_as_such() -> None:
    verdict = judged(GIB_20, [])
    assert verdict["reasons"] == ["this cluster publishes no Tessera GPU"]


def test_a_users_own_cel_selector_is_named_as_not_judged() -> None:
    template, pod = waiting("own", GIB_20)
    body = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    body["selectors"] = [{"cel": {"expression": "device.attributes['x'].y == 1"}}]
    del template["spec"]["metadata"]["annotations"]
    verdict = as_data(judge(pod, snapshot([gpu_slice("node-a", [80])], [], [template])))
    assert verdict["fits"]
    assert (
        verdict["reasons"][-1]
        == "its claims' own CEL selectors are not judged here: device.attributes['x'].y == 1"
    )


def test_a_long_list_of_full_gpus_names_five_and_counts_the_rest_in_one_sentence() -> None:
    claims = [used("node-a", i, "70Gi", f"a{i}") for i in range(7)]
    (reason,) = judged(GIB_20, [gpu_slice("node-a", [80] * 7)], claims)["reasons"]
    assert reason.count("has 10Gi free, the claim asks 20Gi") == 5
    assert reason.endswith("GPU-node-a-4 on node-a has 10Gi free, the claim asks 20Gi; and 2 more GPUs")
