"""A pod written for HAMi, unchanged, runs on a real node with its limits enforced: the apiserver
calls the webhook, the controller manager makes the claim from the template it wrote, the scheduler
places a share of a GPU the node daemon publishes, the real kubelet prepares it, and a CUDA program
in the container sees exactly its gpumem and cannot allocate past it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tessera.kube import raw_json
from tessera.quantity import MiB, quantity_to_int
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.node import NodeFactory, RealNode
from tests.e2e.test_driver_node import PROBE_IMAGE, limit_script, probe_image, sections, wait_done
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]  # the fixture, shared with the driver's end-to-end tests


@pytest.fixture(scope="module")
def gpu_node(
    cluster: LocalCluster, kube: client.ApiClient, node_factory: NodeFactory, probe_image: Path
) -> Iterator[RealNode]:
    """One real node with 2 simulated 80 GiB GPUs, the daemon registered and published."""
    ensure_device_class(kube)
    [node] = node_factory.start(1, extra_images=[probe_image])
    driver = DriverNode(
        cluster, node.name, kubelet_root=node.paths.kubelet_root, cdi_dir=node.paths.cdi_dir, gpus=2
    )
    try:
        driver.start()
        driver.wait_ready()
        yield node
    finally:
        driver.cleanup()


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster, kube: client.ApiClient, gpu_node: RealNode) -> Iterator[RunningWebhook]:
    running = RunningWebhook(kube, cluster)
    yield running
    running.stop()


def test_a_hami_pod_runs_converted_with_its_gpumem_enforced(
    gpu_node: RealNode, webhook: RunningWebhook, kube: client.ApiClient, namespace: str
) -> None:
    webhook.wait_effective(namespace)
    limit = 8000 * MiB
    pod = {
        "metadata": {"name": "hami"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": gpu_node.name},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "probe",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", limit_script(limit)],
                    "resources": {"limits": {"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"}},
                }
            ],
        },
    }
    core = client.CoreV1Api(kube)
    created = raw_json(
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod), _preload_content=False)
    )
    assert created["spec"]["resourceClaims"][0]["name"] == "tessera-probe"
    seen = sections(wait_done(kube, namespace, "hami"))
    assert int(seen["info"]["total"]) == limit, seen
    assert seen["over"]["rc"] == "2", seen  # CUDA_ERROR_OUT_OF_MEMORY past the claim
    assert seen["unset"]["rc"] == "2", seen
    assert seen["fits"]["rc"] == "0", seen
    status = raw_json(core.read_namespaced_pod("hami", namespace, _preload_content=False))["status"]
    claim_name = status["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = raw_json(
        client.ResourceV1Api(kube).read_namespaced_resource_claim(
            claim_name, namespace, _preload_content=False
        )
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    consumed = {k: quantity_to_int(v) for k, v in result["consumedCapacity"].items()}
    assert consumed == {"memory": limit, "cores": 30}
