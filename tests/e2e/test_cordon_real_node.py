"""Cordoning a GPU on a real node (kubelet, containerd, the daemon, simulated GPUs): a pod running on
GPU 0 keeps its container and its limits while GPU 0 is cordoned, and a new GPU pod created meanwhile
runs on GPU 1 — first with the DeviceTaintRule docs/driver.md shows, then with HAMi's
``hami.io/device-cordon`` annotation. tests/integration/test_device_cordon.py holds the scheduling
side (a pod that can only use GPU 0 stays Pending, undoing the cordon lets it in) with the kubelet's
calls made by the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tessera.names import CORDONED_TAINT, HAMI_DEVICE_CORDON
from tessera.quantity import GiB
from testbed.chart_bed import enforcement_script
from testbed.cluster import LocalCluster
from testbed.kubectl import kubectl
from testbed.node import NodeFactory
from testbed.pod_state import sections
from testbed.polling import poll_until
from tests.e2e.test_driver_node import (
    GpuNode,
    claim_of,
    limit_script,
    one_gpu_node,
    probe_image,
    run_share_pod,
    wait_done,
)
from tests.integration.test_device_cordon import devices_of, docs_rule

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]

SHARE = 10 * GiB


@pytest.fixture(scope="module")
def gpu_node(
    cluster: LocalCluster, kube: client.ApiClient, node_factory: NodeFactory, probe_image: Path
) -> Iterator[GpuNode]:
    """A real node with 2 simulated 80 GiB GPUs and the daemon registered and published."""
    with one_gpu_node(cluster, kube, node_factory, probe_image) as node:
        yield node


def _container(kube: client.ApiClient, namespace: str, pod: str) -> str:
    status = client.CoreV1Api(kube).read_namespaced_pod(pod, namespace).status
    assert status is not None and status.container_statuses
    return str(status.container_statuses[0].container_id)


def _device(kube: client.ApiClient, namespace: str, pod: str) -> str:
    (result,) = claim_of(kube, namespace, pod)["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def _cordon_spares_the_running_pod(
    kube: client.ApiClient, cluster: LocalCluster, namespace: str, node: GpuNode, suffix: str
) -> None:
    """With GPU 0 cordoned: pod "running-<suffix>" (made before, on GPU 0) still runs in the same
    container and its limit holds; a new pod runs on GPU 1 with its own limit."""
    running = f"running-{suffix}"
    new = f"new-{suffix}"
    devices = devices_of(kube, node.name)
    run_share_pod(kube, namespace, node, new, [{"memory": "10Gi", "cores": "10"}], limit_script(SHARE))
    assert _device(kube, namespace, new) == devices[node.gpu_uuid(1)]["name"]
    script = enforcement_script(SHARE)
    seen = sections(
        kubectl(cluster.admin_kubeconfig, "exec", "-n", namespace, running, "--", "sh", "-c", script)
    )
    assert int(seen["info"]["total"]) == SHARE, json.dumps(seen)
    assert seen["over"]["rc"] == "2", json.dumps(seen)
    assert seen["fits"]["rc"] == "0", json.dumps(seen)
    assert _device(kube, namespace, running) == devices[node.gpu_uuid(0)]["name"]


def _running_on_gpu0(kube: client.ApiClient, namespace: str, node: GpuNode, name: str) -> str:
    """Pod ``name`` running with a 10 GiB share pinned to GPU 0; its container ID."""
    script = limit_script(SHARE)
    run_share_pod(kube, namespace, node, name, [{"memory": "10Gi", "cores": "10"}], script, node.gpu_uuid(0))
    return _container(kube, namespace, name)


def test_a_device_taint_rule_keeps_new_pods_off_gpu_0_and_the_pod_on_it_running(
    gpu_node: GpuNode, kube: client.ApiClient, cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    container = _running_on_gpu0(kube, namespace, gpu_node, "running-rule")
    rule = docs_rule(gpu_node.name, devices_of(kube, gpu_node.name)[gpu_node.gpu_uuid(0)]["name"])
    manifest = tmp_path / "rule.yaml"
    manifest.write_text(yaml.safe_dump(rule))
    kubectl(cluster.admin_kubeconfig, "apply", "-f", str(manifest))
    try:
        _cordon_spares_the_running_pod(kube, cluster, namespace, gpu_node, "rule")
    finally:
        kubectl(cluster.admin_kubeconfig, "delete", "-f", str(manifest))
    assert _container(kube, namespace, "running-rule") == container, "the GPU container was restarted"


def test_hamis_annotation_keeps_new_pods_off_gpu_0_and_the_pod_on_it_running(
    gpu_node: GpuNode, kube: client.ApiClient, cluster: LocalCluster, namespace: str
) -> None:
    container = _running_on_gpu0(kube, namespace, gpu_node, "running-annotation")
    gpu0 = gpu_node.gpu_uuid(0)
    kubectl(cluster.admin_kubeconfig, "annotate", "node", gpu_node.name, f"{HAMI_DEVICE_CORDON}={gpu0}")
    try:
        poll_until(
            lambda: (
                [t["key"] for t in devices_of(kube, gpu_node.name)[gpu0].get("taints", [])]
                == [CORDONED_TAINT]
            ),
            30,
            "GPU 0 cordoned in the slice",
        )
        _cordon_spares_the_running_pod(kube, cluster, namespace, gpu_node, "annotation")
    finally:
        kubectl(cluster.admin_kubeconfig, "annotate", "node", gpu_node.name, f"{HAMI_DEVICE_CORDON}-")
    assert _container(kube, namespace, "running-annotation") == container, "the GPU container was restarted"
    assert wait_done(kube, namespace, "running-annotation")  # still running: wait_done fails on an ended pod
