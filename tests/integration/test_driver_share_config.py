"""A claim's ShareConfig (priority, enforcement) through the real control plane and the real daemon:
the scheduler copies the claim's opaque configuration into its allocation and the daemon acts on
it at prepare - a malformed one, enforcement off on part of a GPU, or priority 0 in a namespace the
administrator did not grant it, refuses the claim with one sentence (the kubelet's answer, which it
puts in the pod's events), enforcement off on a whole GPU prepares it without the shim, and priority
reaches the limits file and the GPU's board mount.

The refusal's sentence is also the claim's own Ready condition: the claims are written through
Tessera's client, which sends canonical JSON as the webhook does (tessera/kube.py says why that
matters for a status PATCH).

Kubelet-less nodes as in test_driver_api.py: the real scheduler allocates, the test makes the
kubelet's calls itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS, DRIVER_NAME
from tessera.shim import format as shim_format
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, published_driver_node
from testbed.kubelet_client import ClaimRef, KubeletClient
from testbed.pod_state import wait_until_bound
from testbed.polling import poll_until
from tests.conftest import made_namespace

pytestmark = pytest.mark.integration


@pytest.fixture
def driver_node(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str], namespace: str
) -> Iterator[DriverNode]:
    """The daemon on a fresh kubelet-less node with 2 simulated 80 GiB GPUs, published, granting
    priority 0 to the test's namespace (as the chart's webhook.highPriorityNamespaces would)."""
    grant = [f"--high-priority-namespace={namespace}"]
    with published_driver_node(cluster, kube, fake_node(), gpus=2, extra_args=grant) as node:
        yield node


def configured_share(
    kube: client.ApiClient, namespace: str, node: str, name: str, memory: str, cores: str, **config: Any
) -> ClaimRef:
    """A ResourceClaim asking ``memory`` and ``cores`` of one GPU with ``config`` as its ShareConfig
    (as the webhook writes it), used by a pod on ``node``; returned once the scheduler allocated it."""
    resource, core = client.ResourceV1Api(kube), client.CoreV1Api(kube)
    parameters = {"apiVersion": "gpu.tessera.dev/v1", "kind": "ShareConfig", **config}
    claim = {
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DEVICE_CLASS,
                            "capacity": {"requests": {"memory": memory, "cores": cores}},
                        },
                    }
                ],
                "config": [
                    {"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
                ],
            }
        },
    }
    resource.create_namespaced_resource_claim(namespace, client.ResourceV1ResourceClaim.model_validate(claim))
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "main", "image": "none", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))
    wait_until_bound(core, namespace, name)

    def allocated() -> dict[str, Any] | None:
        body = raw_json(resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
        return body if (body.get("status") or {}).get("allocation") else None

    body = poll_until(allocated, 30, f"{name} allocated")
    assert body["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] == parameters
    return namespace, name, str(body["metadata"]["uid"])


def test_a_bad_share_config_and_enforcement_off_on_a_partial_share_are_refused_with_a_sentence(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    node = driver_node.node_name
    bad = configured_share(kube, namespace, node, "bad", "1Gi", "10", priority=7)
    half = configured_share(kube, namespace, node, "partial", "40Gi", "100", enforcement="off")
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        response = kubelet.prepare([bad, half])
    finally:
        kubelet.close()
    expected = {
        bad[2]: f"ResourceClaim {namespace}/bad: the ShareConfig in its configuration has priority 7; "
        "it must be 0 (high) or 1 (low)",
        half[2]: f"ResourceClaim {namespace}/partial asks for enforcement off (request gpu), which is "
        "allowed only on a whole GPU, but it holds 40960 MiB of 81920 MiB and 100 of 100 cores of ",
    }
    refused_with_a_sentence(kube, driver_node, response, expected, [bad, half])


def test_priority_0_in_a_namespace_not_granted_it_is_refused_with_a_sentence_and_granted_in_one(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    """A claim written by hand never passes the webhook: the daemon, told the chart's list, refuses
    priority 0 outside it with a sentence naming the namespace and the chart value, and prepares it
    in a namespace on the list."""
    node = driver_node.node_name
    with made_namespace(kube) as other:
        refused = configured_share(kube, other, node, "high", "1Gi", "10", priority=0)
        granted = configured_share(kube, namespace, node, "high", "1Gi", "10", priority=0)
        kubelet = KubeletClient(driver_node.dra_socket)
        try:
            response = kubelet.prepare([refused, granted])
        finally:
            kubelet.close()
        expected = {
            refused[2]: f"ResourceClaim {other}/high: priority 0 (high), asked by request gpu, is granted "
            "only to namespaces an administrator lists in the chart value webhook.highPriorityNamespaces, "
            f'and namespace "{other}" is not listed',
        }
        refused_with_a_sentence(kube, driver_node, response, expected, [refused])
    assert response.claims[granted[2]].error == ""
    (limit,) = shim_format.read_limits(driver_node.state_dir / "claims" / granted[2] / "limits") or []
    assert limit.priority == shim_format.PRIORITY_HIGH


def refused_with_a_sentence(
    kube: client.ApiClient,
    driver_node: DriverNode,
    response: Any,
    expected: dict[str, str],
    claims: list[ClaimRef],
) -> None:
    """Each of ``claims`` was refused by the kubelet call with its ``expected`` sentence, has it as
    its Ready condition, and left nothing on the node."""
    resource = client.ResourceV1Api(kube)
    for claim in claims:
        error = response.claims[claim[2]].error
        assert error.startswith(expected[claim[2]]), error
        assert not response.claims[claim[2]].devices
        assert not (driver_node.state_dir / "claims" / claim[2]).exists()

        def ready_condition(namespace: str = claim[0], name: str = claim[1]) -> dict[str, Any] | None:
            body = raw_json(resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
            for device in (body.get("status") or {}).get("devices") or []:
                for condition in device.get("conditions") or []:
                    if condition.get("type") == "Ready":
                        return dict(condition)
            return None

        condition = poll_until(ready_condition, 30, f"the Ready condition of {claim[1]}")
        assert (condition["status"], condition["reason"]) == ("False", "PrepareFailed"), condition
        assert condition["message"].startswith(expected[claim[2]]), condition


def test_enforcement_off_on_a_whole_gpu_prepares_it_without_the_shim_and_priority_reaches_the_board(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    node = driver_node.node_name
    whole = configured_share(kube, namespace, node, "whole", "80Gi", "100", enforcement="off")
    high = configured_share(kube, namespace, node, "high", "10Gi", "30", priority=0)
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        response = kubelet.prepare([whole, high])
    finally:
        kubelet.close()
    assert response.claims[whole[2]].error == "" and response.claims[high[2]].error == ""
    (whole_device,) = response.claims[whole[2]].devices
    (high_device,) = response.claims[high[2]].devices
    assert whole_device.device_name != high_device.device_name

    spec = json.loads((driver_node.cdi_dir / f"k8s.gpu.tessera.dev-claim_{whole[2]}.json").read_text())
    edits = spec["containerEdits"]
    mounted = {m["containerPath"] for m in edits["mounts"]}
    assert not mounted & {"/run/tessera", "/run/tessera/usage"}
    assert not any(e.startswith("TESSERA_") for e in edits["env"])
    assert any(e.startswith("CUDA_VISIBLE_DEVICES=GPU-") for e in edits["env"])
    folder = driver_node.state_dir / "claims" / whole[2]
    assert not (folder / "limits").exists()
    preloaded = (folder / "ld.so.preload").read_text().split()
    assert [p.rsplit("/", 1)[1] for p in preloaded] == ["libcuda.so.1", "libnvidia-ml.so.1"]
    assert "tessera/shim" not in " ".join(preloaded)

    (limit,) = shim_format.read_limits(driver_node.state_dir / "claims" / high[2] / "limits") or []
    assert (limit.memory_bytes, limit.cores, limit.priority) == (10 << 30, 30, shim_format.PRIORITY_HIGH)
    spec = json.loads((driver_node.cdi_dir / f"k8s.gpu.tessera.dev-claim_{high[2]}.json").read_text())
    boards = {
        m["containerPath"]: m for m in spec["containerEdits"]["mounts"] if "priority" in m["containerPath"]
    }
    board = boards[f"/run/tessera/priority/{limit.uuid}"]
    assert board["options"][0] == "rw"
    assert shim_format.read_board(driver_node.state_dir / "priority" / limit.uuid) is not None
