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

import contextlib
import functools
import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import raw_json
from tessera.kubectl import usage
from tessera.kubectl.cli import main
from tessera.names import DEVICE_CLASS, DRIVER_NAME, HAMI_GPU, HAMI_GPUMEM, HAMI_USE_TYPE, HAMI_USE_UUID
from tessera.webhook import waiting_pods
from testbed.cluster import LocalCluster
from testbed.dra_objects import allocated_claim
from testbed.driver_node import ensure_device_class
from testbed.names import unique_name
from testbed.pod_state import wait_until_unschedulable
from testbed.polling import poll_until
from testbed.queue_bed import plain_gpu_pod, publish_gpus
from testbed.share_pods import share_pod
from tests.conftest import made_namespace
from tests.integration.webhook_bed import remove_account, webhook_api_client

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


def cordon(kube: client.ApiClient, node: str, device: str) -> str:
    """A DeviceTaintRule cordoning ``device`` of ``node``'s pool, as docs/driver.md shows; its name."""
    rule = f"cordon-{node}-{device}"
    client.ResourceV1Api(kube).create_device_taint_rule(
        client.V1DeviceTaintRule.model_validate(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": rule},
                "spec": {
                    "deviceSelector": {"driver": DRIVER_NAME, "pool": node, "device": device},
                    "taint": {
                        "key": "gpu.tessera.dev/cordoned",
                        "value": "maintenance",
                        "effect": "NoSchedule",
                    },
                },
            }
        )
    )
    return rule


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
    taint_rules.append(cordon(kube, node, f"gpu-{node}-1"))
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


def test_a_tenants_pod_dressed_as_an_exporter_is_not_read_for_live_figures(
    kube: client.ApiClient, namespace: str
) -> None:
    """A running pod in a tenant's namespace with the exporter's labels and a port named metrics:
    the plugin reads exporters only in the namespace Helm recorded on the chart's DeviceClass, so
    the tenant's pod is not among them (named explicitly, it would be: the test's control)."""
    ensure_device_class(kube)
    resource = client.ResourceV1Api(kube)
    core = client.CoreV1Api(kube)
    with made_namespace(kube) as release:
        annotation = {"metadata": {"annotations": {usage.RELEASE_NAMESPACE_ANNOTATION: release}}}
        resource.patch_device_class(DEVICE_CLASS, annotation)
        try:
            fake = {
                "metadata": {"name": "exporter-lookalike", "labels": label_map(usage.EXPORTER_SELECTOR)},
                "spec": {
                    # Never placed: a real node of the session's (a kubelet) would take the pod and
                    # write its own status (image not pulled, Pending) over the one below.
                    "schedulingGates": [{"name": "tessera.dev/never"}],
                    "containers": [
                        {
                            "name": "exporter",
                            "image": "example.invalid/any",
                            "ports": [{"name": "metrics", "containerPort": 31995}],
                        }
                    ],
                },
            }
            core.create_namespaced_pod(namespace, client.V1Pod.model_validate(fake))
            core.patch_namespaced_pod_status(
                "exporter-lookalike", namespace, {"status": {"phase": "Running", "podIP": "127.0.0.1"}}
            )
            found = usage.scrape(kube)
            assert (found.namespace, found.exporters) == (release, 0)
            assert usage.scrape(kube, namespace).exporters == 1, "the lookalike is a running exporter pod"
        finally:
            gone = {"metadata": {"annotations": {usage.RELEASE_NAMESPACE_ANNOTATION: None}}}
            resource.patch_device_class(DEVICE_CLASS, gone)


def label_map(selector: str) -> dict[str, str]:
    return dict(term.split("=", 1) for term in selector.split(","))


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


def waiting_events(kube: client.ApiClient, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The webhook's Events on ``pod``, oldest first."""
    found = raw_json(
        client.CoreV1Api(kube).list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.name={pod},reason={waiting_pods.REASON}",
            _preload_content=False,
        )
    )["items"]
    return sorted(found, key=lambda e: (e["lastTimestamp"], e["metadata"]["name"]))


def test_a_waiting_pod_is_told_why_once_per_reason_by_either_replica(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., str],
    taint_rules: list[str],
    waiting_pod: WaitingPod,
) -> None:
    """The webhook's look at waiting pods, as two replicas run it, under the chart's webhook rules:
    the first writes one Event with what `why` says, the second writes nothing, nor does either
    while the reasons stand; when they change, one new Event; when they change back, the first
    Event moves to now instead of a third."""
    resource = client.ResourceV1Api(kube)
    node = gpu_node(80, 80)
    for index in (0, 1):
        allocated_claim(resource, namespace, node, f"gpu-{node}-{index}", f"placed-{index}", memory="75Gi")
    waiting_pod("waits", share(20), MINE)
    account = unique_name("webhook")
    api = webhook_api_client(kube, cluster, account)
    try:
        first, second = (waiting_pods.WaitingPods(api, 0, 1, replica) for replica in ("a", "b"))

        def told() -> list[str]:
            return [e["message"] for e in waiting_events(kube, namespace, "waits")]

        def said(reasons: list[str]) -> str:
            return "waits for a GPU share: " + "; ".join(reasons)

        no_room = why(cluster, namespace, "waits")["reasons"]
        assert no_room[0].startswith("no GPU the claim may use has room: "), no_room
        first.sweep()
        second.sweep()
        first.sweep()
        assert told() == [said(no_room)]

        taint_rules.append(cordon(kube, node, f"gpu-{node}-1"))
        resource.delete_namespaced_resource_claim("placed-1", namespace)
        cordoned = poll_until(
            lambda: found if (found := why(cluster, namespace, "waits")["reasons"]) != no_room else None,
            30,
            "the reasons to change",
        )
        assert cordoned == [
            f"every GPU that fits is cordoned: GPU-{node}-1 on {node} (gpu.tessera.dev/cordoned)"
        ]
        second.sweep()
        first.sweep()
        assert sorted(told()) == sorted([said(no_room), said(cordoned)])  # one second may hold both

        time.sleep(1.1)  # Event times have whole seconds: the move must show
        allocated_claim(resource, namespace, node, f"gpu-{node}-1", "placed-1", memory="75Gi")
        resource.delete_device_taint_rule(taint_rules.pop())
        poll_until(
            lambda: why(cluster, namespace, "waits")["reasons"] == no_room, 30, "the first reasons back"
        )
        first.sweep()
        second.sweep()
        assert told() == [said(cordoned), said(no_room)], "the first Event moved to now, no third one"
        pod = raw_json(client.CoreV1Api(kube).read_namespaced_pod("waits", namespace, _preload_content=False))
        assert not pod["spec"].get("nodeName"), "the pod waited throughout"
    finally:
        remove_account(kube, account)


def test_a_pod_that_cannot_be_told_does_not_keep_the_others_from_being_told(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., str],
    waiting_pod: WaitingPod,
) -> None:
    """A waiting pod in a namespace being deleted, where the API server refuses new Events, is
    skipped (and logged); the other waiting pods of the same look are still told."""
    gpu_node(80)
    core = client.CoreV1Api(kube)
    doomed = unique_name("doomed")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=doomed)))
    account = unique_name("webhook")
    try:
        poll_until(
            lambda: core.read_namespaced_service_account("default", doomed), 30, "default ServiceAccount"
        )
        plain_gpu_pod(kube, doomed, "doomed", None, share(100), MINE)
        wait_until_unschedulable(core, doomed, "doomed")
        core.patch_namespaced_pod(
            "doomed", doomed, {"metadata": {"finalizers": ["testbed.tessera.dev/hold"]}}
        )
        core.delete_namespace(doomed)
        waiting_pod("told", share(100), MINE)
        replica = waiting_pods.WaitingPods(webhook_api_client(kube, cluster, account), 0, 1, "a")
        replica.sweep()
        assert [e["message"] for e in waiting_events(kube, namespace, "told")] == [
            "waits for a GPU share: " + "; ".join(why(cluster, namespace, "told")["reasons"])
        ]
        assert waiting_events(kube, doomed, "doomed") == []
    finally:
        remove_account(kube, account)
        with contextlib.suppress(ApiException):
            core.patch_namespaced_pod("doomed", doomed, {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiException):
            core.delete_namespace(doomed)


def test_a_pods_own_text_reaches_its_event_escaped(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., str],
    waiting_pod: WaitingPod,
) -> None:
    """From where a tenant stands: a GPU type with a terminal escape sequence and a bidirectional
    override, which the reasons quote. The Event the webhook writes carries them escaped, so
    `kubectl describe` shows the characters' names, never acts on them."""
    gpu_node(80)
    waiting_pod("escapes", share(20), {HAMI_USE_TYPE: "a100\x1b[2J\u202e"})
    account = unique_name("webhook")
    try:
        waiting_pods.WaitingPods(webhook_api_client(kube, cluster, account), 0, 1, "a").sweep()
        [message] = [e["message"] for e in waiting_events(kube, namespace, "escapes")]
    finally:
        remove_account(kube, account)
    assert message.startswith("waits for a GPU share: no GPU's product contains 'a100\\x1b[2j\\u202e'"), (
        message
    )
    assert "\x1b" not in message and "\u202e" not in message
