"""Cordoning one GPU through the real control plane (docs/driver.md "Cordoning a GPU"): the operator's
DeviceTaintRule, applied as the docs write it, and HAMi's ``hami.io/device-cordon`` node annotation,
which the daemon turns into a taint in its slice. Either way new shares avoid the GPU, the share
already on it stays allocated and prepared, and undoing it lets the GPU take new shares again.

The node is a kubelet-less Node with two simulated GPUs and the real daemon under the chart's RBAC;
the real scheduler allocates, and the test makes the kubelet's prepare calls itself. A "probe" pod
whose claim can only use GPU 0 (its UUID in a CEL selector) shows that the scheduler itself sees the
cordon: it stays Pending while the cordon holds, which also means every share made after that was
allocated with the cordon known.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera.kube import raw_json
from tessera.names import CORDONED_TAINT, DEVICE_CLASS, DRIVER_NAME, HAMI_DEVICE_CORDON, UUID_ATTRIBUTE
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, published_driver_node
from testbed.kubectl import kubectl
from testbed.kubelet_client import ClaimRef, KubeletClient
from testbed.pod_state import (
    single_allocation_result,
    wait_until_bound,
    wait_until_claim_allocated,
    wait_until_unschedulable,
)
from testbed.polling import poll_until
from testbed.share_pods import share_pod
from tests.chart_helm import REPO

pytestmark = pytest.mark.integration

DRIVER_MD = REPO / "docs" / "driver.md"


@pytest.fixture
def driver_node(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[DriverNode]:
    """The daemon on a fresh kubelet-less node with 2 simulated 80 GiB GPUs, published."""
    with published_driver_node(cluster, kube, fake_node(), gpus=2) as node:
        yield node


def _slice(kube: client.ApiClient, node: str) -> dict[str, Any]:
    """The node's one ResourceSlice."""
    (published,) = raw_json(
        client.ResourceV1Api(kube).list_resource_slice(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
    )["items"]
    return dict(published)


def _by_uuid(published: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["attributes"][UUID_ATTRIBUTE]["string"]: d for d in published["spec"]["devices"]}


def devices_of(kube: client.ApiClient, node: str) -> dict[str, dict[str, Any]]:
    """The node's published devices by UUID."""
    return _by_uuid(_slice(kube, node))


def _claim(kube: client.ApiClient, claim: ClaimRef) -> dict[str, Any]:
    return raw_json(
        client.ResourceV1Api(kube).read_namespaced_resource_claim(claim[1], claim[0], _preload_content=False)
    )


def _device_of(kube: client.ApiClient, claim: ClaimRef) -> str:
    (result,) = _claim(kube, claim)["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def _probe(kube: client.ApiClient, namespace: str, node: str, uuid: str) -> str:
    """Pod ``probe`` on ``node`` whose 1 GiB share may only come from the GPU with ``uuid``."""
    expression = f'device.attributes["{DRIVER_NAME}"].{UUID_ATTRIBUTE} == "{uuid}"'
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "probe"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DEVICE_CLASS,
                                "selectors": [{"cel": {"expression": expression}}],
                                "capacity": {"requests": {"memory": "1Gi"}},
                            },
                        }
                    ]
                }
            }
        },
    }
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(
        namespace, client.V1ResourceClaimTemplate.model_validate(template)
    )
    pod = {
        "metadata": {"name": "probe"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "probe"}],
            "containers": [{"name": "main", "image": "none", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    client.CoreV1Api(kube).create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))
    return "probe"


def _prepare(node: DriverNode, claim: ClaimRef) -> Any:
    kubelet = KubeletClient(node.dra_socket)
    try:
        return kubelet.prepare([claim]).claims[claim[2]]
    finally:
        kubelet.close()


def _cordon_holds(
    kube: client.ApiClient, node: DriverNode, namespace: str, running: ClaimRef, gpu0: str, gpu1: str
) -> None:
    """With GPU 0 cordoned: the probe that can only use it stays Pending, two new shares land on
    GPU 1 although GPU 0 has room for them, and the share already on GPU 0 keeps its allocation and
    is prepared again unchanged."""
    core = client.CoreV1Api(kube)
    unschedulable = wait_until_unschedulable(core, namespace, _probe(kube, namespace, node.node_name, gpu0))
    assert "cannot allocate all claims" in (unschedulable.message or "")
    devices = devices_of(kube, node.node_name)
    new = [share_pod(kube, namespace, node.node_name, f"new{i}", memory="5Gi", cores="5") for i in range(2)]
    assert {_device_of(kube, c) for c in new} == {devices[gpu1]["name"]}
    claim = _claim(kube, running)
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == devices[gpu0]["name"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["running"]
    prepared = _prepare(node, running)
    assert prepared.error == ""
    assert [d.device_name for d in prepared.devices] == [devices[gpu0]["name"]]


def _uncordoned(kube: client.ApiClient, node: DriverNode, namespace: str, gpu0: str) -> None:
    """The cordon gone: the probe that can only use GPU 0 gets a share of it."""
    core = client.CoreV1Api(kube)
    wait_until_bound(core, namespace, "probe", timeout=180)
    probe = wait_until_claim_allocated(client.ResourceV1Api(kube), core, namespace, "probe", "gpu")
    assert single_allocation_result(probe).device == devices_of(kube, node.node_name)[gpu0]["name"]


def _running_share_on_gpu0(
    kube: client.ApiClient, node: DriverNode, namespace: str
) -> tuple[ClaimRef, str, str]:
    """A prepared share on the GPU the allocator fills first (GPU 0 here), and the two UUIDs."""
    running = share_pod(kube, namespace, node.node_name, "running", memory="40Gi", cores="40")
    assert _prepare(node, running).error == ""
    by_name = {d["name"]: uuid for uuid, d in devices_of(kube, node.node_name).items()}
    gpu0 = by_name.pop(_device_of(kube, running))
    (gpu1,) = by_name.values()
    return running, gpu0, gpu1


def docs_rule(node: str, device: str) -> dict[str, Any]:
    """The DeviceTaintRule of docs/driver.md "Cordoning a GPU", placeholders filled in."""
    section = DRIVER_MD.read_text().split("## Cordoning a GPU", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    text = block.group(1).replace("<node-name>", node).replace("<device-name>", device)
    rule: dict[str, Any] = yaml.safe_load(text)
    return rule


def test_a_device_taint_rule_as_the_docs_write_it_cordons_one_gpu_and_deleting_it_uncordons(
    driver_node: DriverNode, kube: client.ApiClient, cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    running, gpu0, gpu1 = _running_share_on_gpu0(kube, driver_node, namespace)
    device0 = devices_of(kube, driver_node.node_name)[gpu0]["name"]
    rule = docs_rule(driver_node.node_name, device0)
    assert rule["apiVersion"] == "resource.k8s.io/v1"
    manifest = tmp_path / "rule.yaml"
    manifest.write_text(yaml.safe_dump(rule))
    kubectl(cluster.admin_kubeconfig, "apply", "-f", str(manifest))
    try:
        _cordon_holds(kube, driver_node, namespace, running, gpu0, gpu1)
    finally:
        kubectl(cluster.admin_kubeconfig, "delete", "devicetaintrule", rule["metadata"]["name"])
    _uncordoned(kube, driver_node, namespace, gpu0)
    assert "taints" not in devices_of(kube, driver_node.node_name)[gpu0]  # the rule never touched the slice


def test_hamis_device_cordon_annotation_taints_that_gpu_in_the_slice_and_removing_it_uncordons(
    driver_node: DriverNode, kube: client.ApiClient, cluster: LocalCluster, namespace: str
) -> None:
    running, gpu0, gpu1 = _running_share_on_gpu0(kube, driver_node, namespace)
    node = driver_node.node_name
    kubectl(cluster.admin_kubeconfig, "annotate", "node", node, f"{HAMI_DEVICE_CORDON}={gpu0}")
    taints = poll_until(lambda: devices_of(kube, node)[gpu0].get("taints"), 30, "GPU 0 tainted")
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        (CORDONED_TAINT, "hami.io-device-cordon", "NoSchedule")
    ]
    assert "taints" not in devices_of(kube, node)[gpu1]
    _cordon_holds(kube, driver_node, namespace, running, gpu0, gpu1)

    kubectl(cluster.admin_kubeconfig, "annotate", "node", node, f"{HAMI_DEVICE_CORDON}-")
    poll_until(lambda: "taints" not in devices_of(kube, node)[gpu0], 30, "GPU 0 untainted")
    _uncordoned(kube, driver_node, namespace, gpu0)


def test_a_cordon_on_the_node_when_the_daemon_starts_is_in_its_first_slice(
    driver_node: DriverNode, kube: client.ApiClient, cluster: LocalCluster
) -> None:
    """A restarted daemon never publishes a cordoned GPU untainted, not even for a moment: it reads
    the Node before its first slice. Names that are not GPUs of this node change nothing."""
    node = driver_node.node_name
    gpu0, gpu1 = (g.uuid for g in driver_node.simgpu.spec.gpus)
    elsewhere = "GPU-00000000-dead-beef-0000-000000000000"
    driver_node.stop()
    resource = client.ResourceV1Api(kube)
    for item in raw_json(
        resource.list_resource_slice(field_selector=f"spec.nodeName={node}", _preload_content=False)
    )["items"]:
        resource.delete_resource_slice(item["metadata"]["name"])
    kubectl(cluster.admin_kubeconfig, "annotate", "node", node, f"{HAMI_DEVICE_CORDON}={gpu1},{elsewhere}")
    driver_node.start()
    published = poll_until(lambda: _slice(kube, node), 60, "the slice published again")
    assert published["spec"]["pool"]["generation"] == 1  # the new daemon's first write
    first = _by_uuid(published)
    assert [t["key"] for t in first[gpu1]["taints"]] == [CORDONED_TAINT]
    assert "taints" not in first[gpu0]
    assert elsewhere not in first


def test_effect_none_says_what_noexecute_would_evict_and_noexecute_evicts_the_running_pod(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    """What docs/driver.md says of the other effects: ``None`` is a dry run whose condition counts
    the pods ``NoExecute`` would evict, and ``NoExecute`` deletes the pod whose share is on the GPU."""
    _, gpu0, _ = _running_share_on_gpu0(kube, driver_node, namespace)
    rule = docs_rule(driver_node.node_name, devices_of(kube, driver_node.node_name)[gpu0]["name"])
    rule["spec"]["taint"]["effect"] = "None"
    resource = client.ResourceV1Api(kube)
    name = rule["metadata"]["name"]
    resource.create_device_taint_rule(client.V1DeviceTaintRule.model_validate(rule))
    try:

        def condition() -> dict[str, Any] | None:
            status = (
                raw_json(resource.read_device_taint_rule(name, _preload_content=False)).get("status") or {}
            )
            return next(
                (c for c in status.get("conditions") or [] if c["type"] == "EvictionInProgress"), None
            )

        dry_run = poll_until(condition, 60, "the dry run's condition")
        assert "1 pod would be evicted in 1 namespace if the effect was NoExecute" in dry_run["message"]
        resource.patch_device_taint_rule(name, {"spec": {"taint": {"effect": "NoExecute"}}})
        core = client.CoreV1Api(kube)
        poll_until(
            lambda: raw_json(core.read_namespaced_pod("running", namespace, _preload_content=False))[
                "metadata"
            ].get("deletionTimestamp"),
            60,
            "the running pod evicted",
        )
    finally:
        resource.delete_device_taint_rule(name)
