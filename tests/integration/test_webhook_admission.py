"""The webhook against the real apiserver, controller manager and scheduler: the apiserver calls it
for GPU pods, the controller manager makes each pod's claim from the template it referenced, the
scheduler allocates shares of GPUs the real node daemon publishes, and refusals reach the user.

Nodes are kubelet-less Node objects with the driver over simulated GPUs: "big" has four 80 GiB GPUs,
"small" one 40 GiB GPU. Pods bound to them never run; where a test needs a pod gone, it finishes the
deletion itself (grace period 0), which is the step a kubelet would take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tessera.gpu_request import GpuRequest
from tessera.kube import api_client, create_if_absent, raw_json
from tessera.quantity import GiB, MiB, quantity_to_int
from tessera.webhook.conversion import claim_template
from tessera.webhook.fleet import Fleet
from tessera.webhook.templates import TemplateStore
from testbed.cluster import LocalCluster
from testbed.commands import CommandError
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.fake_nodes import create_ready_node
from testbed.kubectl import kubectl
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.tcp_relay import TcpRelay
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.integration


@dataclass
class Bed:
    webhook: RunningWebhook
    big: DriverNode
    small: DriverNode


@pytest.fixture(scope="module")
def bed(cluster: LocalCluster, kube: client.ApiClient) -> Iterator[Bed]:
    ensure_device_class(kube)
    nodes = []
    for gpus, memory in ((4, 80 * GiB), (1, 40 * GiB)):
        name = unique_name("node")
        create_ready_node(kube, name, None)
        node = DriverNode(cluster, name, gpus=gpus, memory_bytes=memory)
        node.start()
        node.wait_published()
        nodes.append(node)
    webhook = RunningWebhook(kube, cluster)
    try:
        poll_until(
            lambda: webhook.cache.fleet == Fleet((80 * GiB, 40 * GiB), 4),
            30,
            "the webhook's cache to see both nodes",
        )
        yield Bed(webhook, nodes[0], nodes[1])
    finally:
        webhook.stop()
        for node in nodes:
            node.cleanup()
            client.CoreV1Api(kube).delete_node(node.node_name)


@pytest.fixture
def ns(bed: Bed, kube: client.ApiClient, namespace: str) -> Iterator[str]:
    """The test's namespace once the apiserver calls the webhook for it; afterwards its pods are
    deleted outright (no kubelet will), so their claims and GPU shares are freed for the next test."""
    bed.webhook.wait_effective(namespace)
    yield namespace
    core = client.CoreV1Api(kube)
    for pod in raw_json(core.list_namespaced_pod(namespace, _preload_content=False))["items"]:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)


def gpu_pod(name: str, limits: dict[str, Any], node: str | None = None, **metadata: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "tessera.local/none", "resources": {"limits": limits}}]
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **metadata}, "spec": spec}


def create_pod(
    kube: client.ApiClient, namespace: str, body: dict[str, Any], **options: Any
) -> dict[str, Any]:
    return raw_json(
        client.CoreV1Api(kube).create_namespaced_pod(
            namespace, client.V1Pod.model_validate(body), _preload_content=False, **options
        )
    )


def templates_in(kube: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw_json(
        client.ResourceV1Api(kube).list_namespaced_resource_claim_template(namespace, _preload_content=False)
    )["items"]
    return items


def claims_in(kube: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw_json(
        client.ResourceV1Api(kube).list_namespaced_resource_claim(namespace, _preload_content=False)
    )["items"]
    return items


def allocated_claim_of(kube: client.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    """The pod's Tessera claim once the scheduler allocated it."""
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)

    def claim() -> dict[str, Any] | None:
        status = (
            raw_json(core.read_namespaced_pod(pod, namespace, _preload_content=False)).get("status") or {}
        )
        names = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []]
        if not names or not names[0]:
            return None
        body = raw_json(resource.read_namespaced_resource_claim(names[0], namespace, _preload_content=False))
        return body if (body.get("status") or {}).get("allocation") else None

    return poll_until(claim, 60, f"{namespace}/{pod}'s claim allocated")


def test_a_deployment_of_three_gpu_pods_shares_one_template_and_its_claims_go_with_it(
    bed: Bed, kube: client.ApiClient, ns: str
) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    labels = {"app": "share"}
    template = gpu_pod(
        "ignored", {"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"}, bed.big.node_name
    )
    template = {"metadata": {"labels": labels}, "spec": template["spec"]}
    deployment = {
        "metadata": {"name": "share"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": template},
    }
    apps.create_namespaced_deployment(ns, client.V1Deployment.model_validate(deployment))

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = raw_json(
            core.list_namespaced_pod(ns, label_selector="app=share", _preload_content=False)
        )["items"]
        return items

    def three_pods() -> list[dict[str, Any]] | None:
        found = pods()
        return found if len(found) == 3 else None

    made = poll_until(three_pods, 60, "3 pods")
    references = {p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in made}
    assert len(references) == 1
    for p in made:
        limits = p["spec"]["containers"][0]["resources"].get("limits") or {}
        assert not any(k.startswith("nvidia.com/") for k in limits)
        assert p["spec"]["containers"][0]["resources"]["claims"] == [{"name": "tessera-main"}]
    [stored] = templates_in(kube, ns)
    assert stored["metadata"]["name"] in references
    for p in made:
        claim = allocated_claim_of(kube, ns, p["metadata"]["name"])
        [result] = claim["status"]["allocation"]["devices"]["results"]
        consumed = {k: quantity_to_int(v) for k, v in result["consumedCapacity"].items()}
        assert consumed == {"memory": 8000 * 2**20, "cores": 30}
    claims = claims_in(kube, ns)
    assert len(claims) == 3
    assert all(c["metadata"]["ownerReferences"][0]["kind"] == "Pod" for c in claims)

    apps.delete_namespaced_deployment("share", ns)

    def terminating() -> list[dict[str, Any]] | None:
        found = pods()
        return found if found and all(x["metadata"].get("deletionTimestamp") for x in found) else None

    for doomed in poll_until(terminating, 60, "the pods marked for deletion"):
        core.delete_namespaced_pod(
            doomed["metadata"]["name"], ns, grace_period_seconds=0
        )  # the kubelet's part
    poll_until(lambda: not claims_in(kube, ns), 60, "the claims deleted with their pods")


def test_gpumem_percentage_gets_the_share_of_the_gpu_the_scheduler_chose(
    bed: Bed, kube: client.ApiClient, ns: str
) -> None:
    for name, node in (("on-big", bed.big.node_name), ("on-small", bed.small.node_name)):
        create_pod(kube, ns, gpu_pod(name, {"nvidia.com/gpumem-percentage": "50"}, node))
    shares = {}
    for name in ("on-big", "on-small"):
        [result] = allocated_claim_of(kube, ns, name)["status"]["allocation"]["devices"]["results"]
        shares[name] = (result["pool"], quantity_to_int(result["consumedCapacity"]["memory"]))
    assert shares == {"on-big": (bed.big.node_name, 40 * GiB), "on-small": (bed.small.node_name, 20 * GiB)}


def test_annotations_steer_the_pod_to_the_gpus_they_name(bed: Bed, kube: client.ApiClient, ns: str) -> None:
    small_uuid = bed.small.simgpu.spec.gpus[0].uuid
    create_pod(
        kube,
        ns,
        gpu_pod("by-uuid", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gpuuuid": small_uuid}),
    )
    create_pod(
        kube,
        ns,
        gpu_pod(
            "not-small",
            {"nvidia.com/gpumem": "1000"},
            annotations={
                "nvidia.com/nouse-gpuuuid": small_uuid,
                "nvidia.com/nouse-gputype": 'x") || true || ("\\',
            },
        ),
    )
    [by_uuid] = allocated_claim_of(kube, ns, "by-uuid")["status"]["allocation"]["devices"]["results"]
    assert by_uuid["pool"] == bed.small.node_name
    assert quantity_to_int(by_uuid["consumedCapacity"]["memory"]) == 40 * GiB  # no gpumem: the whole memory
    [other] = allocated_claim_of(kube, ns, "not-small")["status"]["allocation"]["devices"]["results"]
    assert other["pool"] == bed.big.node_name


def test_dry_run_answers_with_the_converted_pod_and_creates_nothing(
    bed: Bed, kube: client.ApiClient, ns: str
) -> None:
    answer = create_pod(kube, ns, gpu_pod("dry", {"nvidia.com/gpumem": "2000"}), dry_run="All")
    assert answer["spec"]["resourceClaims"][0]["name"] == "tessera-main"
    assert templates_in(kube, ns) == []
    assert raw_json(client.CoreV1Api(kube).list_namespaced_pod(ns, _preload_content=False))["items"] == []


def test_an_impossible_request_is_denied_with_its_sentence_shown_by_kubectl_apply(
    bed: Bed, cluster: LocalCluster, kube: client.ApiClient, ns: str, tmp_path: Any
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: huge}\nspec:\n  containers:\n"
        "  - {name: trainer, image: x, resources: {limits: {nvidia.com/gpumem: '90000'}}}\n"
    )
    with pytest.raises(CommandError) as refused:
        kubectl(cluster.admin_kubeconfig, "apply", "-n", ns, "-f", str(manifest))
    shown = str(refused.value)
    assert (
        'container "trainer": nvidia.com/gpumem 90000 (MiB) is more than the largest GPU has (81920 MiB), '
        "so it can never be placed." in shown
    )
    assert templates_in(kube, ns) == []


def test_kube_system_the_release_namespace_and_pods_without_gpus_are_never_sent(
    bed: Bed, kube: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(kube)
    release = "tessera"
    create_if_absent(core.create_namespace, client.V1Namespace(metadata=client.V1ObjectMeta(name=release)))
    sent_before = sum(
        bed.webhook.reviews(o) for o in ("ignored", "untouched", "converted", "denied", "error")
    )
    for namespace in ("kube-system", release):
        kept = create_pod(kube, namespace, gpu_pod("gpu", {"nvidia.com/gpu": "1"}), dry_run="All")
        assert kept["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert "resourceClaims" not in kept["spec"]
    plain = gpu_pod("plain", {"cpu": "100m"}, annotations={"example.com/gpu": "nvidia.com/gpu"})
    created = create_pod(kube, ns, plain)
    assert created["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "100m"}
    assert "resourceClaims" not in created["spec"]
    sent_after = sum(bed.webhook.reviews(o) for o in ("ignored", "untouched", "converted", "denied", "error"))
    assert sent_after == sent_before


def test_a_jobs_template_keeps_its_extended_resources_and_its_pods_are_converted(
    bed: Bed, kube: client.ApiClient, ns: str
) -> None:
    template = gpu_pod(
        "ignored", {"nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "20"}, bed.big.node_name
    )
    template = {"spec": {**template["spec"], "restartPolicy": "Never"}}
    job = {"metadata": {"name": "train"}, "spec": {"template": template, "backoffLimit": 0}}
    client.BatchV1Api(kube).create_namespaced_job(ns, client.V1Job.model_validate(job))
    stored = raw_json(client.BatchV1Api(kube).read_namespaced_job("train", ns, _preload_content=False))
    limits = stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert {k: quantity_to_int(v) for k, v in limits.items()} == {
        "nvidia.com/gpumem": 4000,
        "nvidia.com/gpucores": 20,
    }
    core = client.CoreV1Api(kube)
    [made] = poll_until(
        lambda: raw_json(
            core.list_namespaced_pod(ns, label_selector="job-name=train", _preload_content=False)
        )["items"],
        60,
        "the job's pod",
    )
    assert made["spec"]["resourceClaims"][0]["name"] == "tessera-main"
    assert "limits" not in made["spec"]["containers"][0]["resources"] or not any(
        k.startswith("nvidia.com/") for k in made["spec"]["containers"][0]["resources"]["limits"]
    )
    allocated_claim_of(kube, ns, made["metadata"]["name"])


def test_a_template_that_already_exists_counts_as_made(bed: Bed, kube: client.ApiClient, ns: str) -> None:
    """Two webhook replicas (two stores) admitting the same shape: the second create meets
    AlreadyExists, which is success, and the template is the first one, untouched."""
    template = claim_template(ns, "c", GpuRequest(1, 1000 * MiB, None, 10), bed.webhook.cache.fleet)
    assert TemplateStore(bed.webhook.api).ensure(template) is True
    [made] = templates_in(kube, ns)
    assert TemplateStore(bed.webhook.api).ensure(template) is True
    [still] = templates_in(kube, ns)
    assert still["metadata"]["uid"] == made["metadata"]["uid"]
    assert still["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]


def test_a_template_create_whose_connection_is_lost_before_any_answer_is_sent_again(
    bed: Bed, cluster: LocalCluster, kube: client.ApiClient, ns: str
) -> None:
    """The API server stops or restarts between reading the create and answering it, on a pooled
    connection that was alive when the create went out (a pod admitted right after an API-server
    restart): the client library sends no POST twice, so without a second send the pod would be
    refused with a 500. The store sends it once more, and exactly one template is made."""
    relay = TcpRelay(cluster.api_port)
    relayed = api_client(cluster.admin_kubeconfig)
    relayed.configuration.host = f"https://127.0.0.1:{relay.port}"  # same address: the certificate holds
    try:
        store = TemplateStore(relayed)
        # A first call leaves a live connection in the pool, TLS done: the create's bytes are the
        # next the relay sees from this client (its answer is read whole, so that the connection
        # goes back to the pool).
        resource = client.ResourceV1Api(relayed)
        raw_json(resource.list_namespaced_resource_claim_template(ns, _preload_content=False))
        relay.hang_up_next()
        template = claim_template(ns, "c", GpuRequest(1, 1000 * MiB, None, 10), bed.webhook.cache.fleet)
        assert store.ensure(template) is True
        assert [t["metadata"]["name"] for t in templates_in(kube, ns)] == [template["metadata"]["name"]]
    finally:
        relay.close()


def test_nvidia_gpu_2_gets_two_different_gpus_or_waits_for_a_node_with_two(
    bed: Bed, kube: client.ApiClient, ns: str
) -> None:
    """As in HAMi, ``nvidia.com/gpu: 2`` is two GPUs: both shares of the claim's one request on
    different devices, whether the request is plain (gpumem) or a firstAvailable list (a percentage);
    a node with one GPU does not place it even though that GPU has room for both shares."""
    two = {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30"}
    create_pod(kube, ns, gpu_pod("plain", {**two, "nvidia.com/gpumem": "8000"}, bed.big.node_name))
    create_pod(kube, ns, gpu_pod("percent", {**two, "nvidia.com/gpumem-percentage": "25"}, bed.big.node_name))
    for name, memory in (("plain", 8000 * 2**20), ("percent", 20 * GiB)):
        results = allocated_claim_of(kube, ns, name)["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2
        assert {r["pool"] for r in results} == {bed.big.node_name}
        assert len({r["device"] for r in results}) == 2, results
        assert [quantity_to_int(r["consumedCapacity"]["memory"]) for r in results] == [memory, memory]

    # The small node's one GPU holds two 8000Mi shares of one pod's two containers (two claims)...
    sharing = gpu_pod("two-containers", {"nvidia.com/gpumem": "8000"}, bed.small.node_name)
    main = sharing["spec"]["containers"][0]
    sharing["spec"]["containers"].append({**main, "name": "side"})
    create_pod(kube, ns, sharing)
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)

    def allocated_claims() -> list[dict[str, Any]] | None:
        pod = raw_json(core.read_namespaced_pod("two-containers", ns, _preload_content=False))
        names = [
            s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        ]
        if len(names) != 2 or not all(names):
            return None
        claims = [
            raw_json(resource.read_namespaced_resource_claim(n, ns, _preload_content=False)) for n in names
        ]
        return claims if all((c.get("status") or {}).get("allocation") for c in claims) else None

    devices = {
        r["device"]
        for c in poll_until(allocated_claims, 60, "both containers' claims allocated")
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    assert len(devices) == 1
    # ... and still has room for two more (40Gi less 16000Mi), but not for nvidia.com/gpu: 2.
    create_pod(kube, ns, gpu_pod("needs-two", {**two, "nvidia.com/gpumem": "8000"}, bed.small.node_name))

    def unschedulable() -> dict[str, Any] | None:
        """The pod once the scheduler tried its claim on the node and could not allocate it."""
        pod = raw_json(core.read_namespaced_pod("needs-two", ns, _preload_content=False))
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("reason") == "Unschedulable"
                and "cannot allocate all claims" in condition.get("message", "")
            ):
                return pod
        return None

    pod = poll_until(unschedulable, 60, "needs-two unschedulable for its claim")
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    [name] = [s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"]]
    claim = raw_json(resource.read_namespaced_resource_claim(name, ns, _preload_content=False))
    assert not (claim.get("status") or {}).get("allocation")
    assert claim["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/uuid"}
    ]
