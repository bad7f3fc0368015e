"""``kubectl tessera`` against a real API server, scheduler and controller manager: ``gpus`` and
``pods`` agree with the allocations the scheduler wrote, and ``why`` gives the right sentence for the
five cases of issue 36's bar, each for a pod the real scheduler has given up on.

The GPUs are published on kubelet-less nodes as the driver publishes them (testbed/queue_bed.py),
with a product no other test publishes, and every waiting pod selects that product (except the one
naming a type no GPU has), so GPUs other tests leave in the shared cluster cannot change a verdict.
Pods are converted by the webhook's own code; shares already placed are claims with the allocation
the scheduler writes, or real pods the scheduler placed.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import raw_json
from tessera.kubectl.cli import main
from tessera.names import DRIVER_NAME, HAMI_GPU, HAMI_GPUMEM, HAMI_USE_TYPE, HAMI_USE_UUID
from testbed.cluster import LocalCluster
from testbed.dra_objects import allocated_claim
from testbed.driver_node import ensure_device_class
from testbed.pod_state import wait_until_unschedulable
from testbed.polling import poll_until
from testbed.queue_bed import plain_gpu_pod, publish_gpus
from testbed.share_pods import share_pod

pytestmark = pytest.mark.integration

PRODUCT = "NVIDIA H200 141GB HBM3e"
MINE = {HAMI_USE_TYPE: "h200"}
"""The selection every waiting pod but the unknown-type one carries: only this module's GPUs."""


def kubectl_tessera(cluster: LocalCluster, *argv: str) -> tuple[int, str, str]:
    """The command as kubectl runs it, with the test bed's kubeconfig; (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    status = main([*argv, "--kubeconfig", str(cluster.admin_kubeconfig), "--no-usage"], out, err)
    return status, out.getvalue(), err.getvalue()


def why(cluster: LocalCluster, namespace: str, pod: str) -> dict[str, Any]:
    status, out, _ = kubectl_tessera(cluster, "why", pod, "-n", namespace, "-o", "json")
    assert status == 0
    verdict: dict[str, Any] = json.loads(out)
    return verdict


@pytest.fixture
def gpu_node(kube: client.ApiClient, fake_node: Callable[..., str]) -> Callable[..., str]:
    """Factory: a fresh Ready node publishing GPUs of these sizes (GiB) of :data:`PRODUCT`, their
    UUIDs GPU-<node>-<index>; node and slice go when the test ends."""
    ensure_device_class(kube)

    def make(*memories_gi: int) -> str:
        node = fake_node()
        publish_gpus(kube, node, memories_gi, product=PRODUCT)
        return node

    return make


@pytest.fixture
def taint_rules(kube: client.ApiClient) -> Iterator[list[str]]:
    """Names of DeviceTaintRules a test makes; deleted afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        client.ResourceV1Api(kube).delete_device_taint_rule(name)


WaitingPod = Callable[[str, dict[str, str], dict[str, str]], None]


@pytest.fixture
def waiting_pod(kube: client.ApiClient, namespace: str) -> Iterator[WaitingPod]:
    """Factory: a pod converted as the webhook converts it, which the scheduler has given up on.
    Each is deleted when the test ends, before its namespace: the scheduler keeps trying pods of a
    namespace being deleted, and would place them on the next test's GPUs."""
    core = client.CoreV1Api(kube)
    made: list[str] = []

    def make(name: str, limits: dict[str, str], annotations: dict[str, str]) -> None:
        plain_gpu_pod(kube, namespace, name, None, limits, annotations)
        made.append(name)
        wait_until_unschedulable(core, namespace, name)

    yield make
    for name in made:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    for name in made:
        poll_until(functools.partial(_gone, core, namespace, name), 30, f"pod {name} deleted")


def _gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def share(gi: int) -> dict[str, str]:
    return {HAMI_GPU: "1", HAMI_GPUMEM: str(gi * 1024)}


def test_why_names_a_type_no_gpu_has_and_the_products_the_cluster_has(
    cluster: LocalCluster,
    namespace: str,
    gpu_node: Callable[..., str],
    waiting_pod: WaitingPod,
) -> None:
    gpu_node(80)
    waiting_pod("wants-a100", share(20), {HAMI_USE_TYPE: "a100"})
    verdict = why(cluster, namespace, "wants-a100")
    assert not verdict["fits"]
    (reason,) = verdict["reasons"]
    assert reason.startswith("no GPU's product contains 'a100' (this cluster has: ")
    assert PRODUCT in reason


def test_why_names_a_uuid_no_gpu_has(
    cluster: LocalCluster,
    namespace: str,
    gpu_node: Callable[..., str],
    waiting_pod: WaitingPod,
) -> None:
    node = gpu_node(80)
    waiting_pod("wants-uuid", share(20), {HAMI_USE_UUID: "GPU-nowhere"})
    (reason,) = why(cluster, namespace, "wants-uuid")["reasons"]
    assert reason.startswith("no GPU has UUID 'GPU-nowhere' (this cluster has: ")
    assert f"GPU-{node}-0" in reason


def test_why_names_each_gpus_free_memory_when_the_share_is_too_big_for_all(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., str],
    waiting_pod: WaitingPod,
) -> None:
    node = gpu_node(80)
    allocated_claim(client.ResourceV1Api(kube), namespace, node, f"gpu-{node}-0", "placed", memory="68Gi")
    waiting_pod("too-big", share(20), MINE)
    assert why(cluster, namespace, "too-big")["reasons"] == [
        f"no GPU the claim may use has room: GPU-{node}-0 on {node} has 12Gi free, the claim asks 20Gi"
    ]


def test_why_says_every_gpu_that_fits_is_cordoned(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., str],
    taint_rules: list[str],
    waiting_pod: WaitingPod,
) -> None:
    node = gpu_node(80, 80)
    allocated_claim(client.ResourceV1Api(kube), namespace, node, f"gpu-{node}-0", "placed", memory="75Gi")
    rule = f"cordon-{node}"
    client.ResourceV1Api(kube).create_device_taint_rule(
        client.V1DeviceTaintRule.model_validate(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": rule},
                "spec": {
                    "deviceSelector": {"driver": DRIVER_NAME, "pool": node, "device": f"gpu-{node}-1"},
                    "taint": {
                        "key": "gpu.tessera.dev/cordoned",
                        "value": "maintenance",
                        "effect": "NoSchedule",
                    },
                },
            }
        )
    )
    taint_rules.append(rule)
    waiting_pod("cordoned-out", share(20), MINE)
    assert why(cluster, namespace, "cordoned-out")["reasons"] == [
        f"every GPU that fits is cordoned: GPU-{node}-1 on {node} (gpu.tessera.dev/cordoned)"
    ]


def test_why_says_no_node_has_two_gpus_with_room_for_a_two_gpu_request(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., str],
    waiting_pod: WaitingPod,
) -> None:
    two, one = gpu_node(80, 80), gpu_node(80)
    allocated_claim(client.ResourceV1Api(kube), namespace, two, f"gpu-{two}-1", "placed", memory="75Gi")
    waiting_pod("two-gpus", {HAMI_GPU: "2", HAMI_GPUMEM: "20480"}, MINE)
    counts = sorted([f"{two} has 1 (GPU-{two}-0)", f"{one} has 1 (GPU-{one}-0)"])
    assert why(cluster, namespace, "two-gpus")["reasons"] == [
        "the claim asks for 2 different GPUs on one node, and no node has 2 GPUs with room: "
        + ", ".join(counts)
    ]


def test_why_for_a_pod_that_does_not_exist_is_one_line_and_status_1(
    cluster: LocalCluster, namespace: str
) -> None:
    status, out, err = kubectl_tessera(cluster, "why", "absent", "-n", namespace)
    assert (status, out) == (1, "")
    assert err == f"kubectl tessera: pod absent not found in namespace {namespace}\n"


def test_gpus_and_pods_agree_with_the_allocations_the_scheduler_wrote(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, gpu_node: Callable[..., str]
) -> None:
    node = gpu_node(80, 40)
    claims = [
        share_pod(kube, namespace, node, "train", memory="20Gi", cores="30"),
        share_pod(kube, namespace, node, "notebook", memory="8Gi", cores="10"),
    ]
    resource = client.ResourceV1Api(kube)
    allocated: dict[str, tuple[str, str, str]] = {}
    for _, name, _ in claims:
        claim = raw_json(resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        consumed = result["consumedCapacity"]
        allocated[name] = (result["device"], consumed["memory"], consumed["cores"])

    status, out, _ = kubectl_tessera(cluster, "gpus", "-o", "json")
    assert status == 0
    mine = [g for g in json.loads(out)["gpus"] if g["node"] == node]
    assert [g["product"] for g in mine] == [PRODUCT, PRODUCT]
    # Only this test's shares: another test's pod may be placed here too, and counts in the sums.
    shown = {
        s["claim"]: (g["device"], s["pod"], s["memory"], s["cores"])
        for g in mine
        for s in g["shares"]
        if s["namespace"] == namespace
    }
    gib = 1024**3
    assert shown == {
        claims[0][1]: (allocated[claims[0][1]][0], "train", 20 * gib, 30),
        claims[1][1]: (allocated[claims[1][1]][0], "notebook", 8 * gib, 10),
    }
    for gpu in mine:
        assert gpu["memory"]["allocated"] == sum(s["memory"] for s in gpu["shares"])
        assert gpu["cores"]["allocated"] == sum(s["cores"] for s in gpu["shares"])

    status, out, _ = kubectl_tessera(cluster, "pods", "-n", namespace, "-o", "json")
    assert status == 0
    rows = {r["pod"]: r for r in json.loads(out)["shares"]}
    assert set(rows) == {"train", "notebook"}
    assert (rows["train"]["node"], rows["train"]["memoryLimit"], rows["train"]["coresLimit"]) == (
        node,
        20 * gib,
        30,
    )
    assert rows["train"]["uuid"].startswith(f"GPU-{node}-")

    status, out, _ = kubectl_tessera(cluster, "pods", "-n", namespace)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "POD", "CLAIM"]
    assert sorted(line.split()[1] for line in lines[1:]) == ["notebook", "train"]
