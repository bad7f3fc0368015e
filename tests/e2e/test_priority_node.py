"""A claim's ShareConfig on a real node (kubelet, containerd, runc, the daemon, simulated GPUs).

Priority: two pods share one GPU, one of them with priority 0. Inside the containers the GPU's
priority board is writable only by the high-priority one - a low-priority tenant that tries to
write it is refused by the read-only mount - and the low-priority pod's launches are held back
while the high-priority one keeps the GPU busy (its usage region counts the holds).

Enforcement off on a whole GPU: the container runs CUDA on the driver's own libraries, with no
shim, limits file or usage region in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS, DRIVER_NAME
from tessera.shim import format as shim_format
from testbed.cluster import LocalCluster
from testbed.node import NodeFactory
from testbed.pod_state import generated_claim_name, sections
from tests.conftest import made_namespace
from tests.e2e.test_driver_node import DONE, PROBE_IMAGE, GpuNode, one_gpu_node, probe_image, wait_done

# Measured under load or in shares of time: no other test may share the CPUs (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

__all__ = ["probe_image"]


@pytest.fixture(scope="module")
def granted_namespace(kube: client.ApiClient) -> Iterator[str]:
    """A namespace the daemon grants priority 0, as the chart's webhook.highPriorityNamespaces does."""
    with made_namespace(kube) as name:
        yield name


@pytest.fixture(scope="module")
def gpu_node(
    cluster: LocalCluster,
    kube: client.ApiClient,
    node_factory: NodeFactory,
    probe_image: Path,
    granted_namespace: str,
) -> Iterator[GpuNode]:
    """One real node with 2 simulated 80 GiB GPUs and the daemon registered and published."""
    grant = [f"--high-priority-namespace={granted_namespace}"]
    with one_gpu_node(cluster, kube, node_factory, probe_image, extra_args=grant) as node:
        yield node


def share_pod(
    kube: client.ApiClient,
    namespace: str,
    node: GpuNode,
    name: str,
    config: dict[str, Any] | None,
    script: str,
    gpu: int = 0,
    capacity: dict[str, str] | None = None,
) -> None:
    """A pod with ``capacity`` (1Gi) of GPU ``gpu`` of ``node`` and ``config`` as its ShareConfig
    keys (as the webhook writes them), running ``script`` in the probe image."""
    uuid = node.gpu_uuid(gpu)
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": DEVICE_CLASS,
                    "selectors": [
                        {"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].uuid == "{uuid}"'}}
                    ],
                    "capacity": {"requests": capacity or {"memory": "1Gi"}},
                },
            }
        ]
    }
    if config is not None:
        parameters = {"apiVersion": "gpu.tessera.dev/v1", "kind": "ShareConfig", **config}
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
        ]
    template = {"metadata": {"name": name}, "spec": {"spec": {"devices": devices}}}
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(
        namespace, client.V1ResourceClaimTemplate.model_validate(template)
    )
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "probe",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    client.CoreV1Api(kube).create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))


def board_script(uuid: str, then: str) -> str:
    """Whether the container may write the GPU's board, and what a write does; then ``then`` (a
    command ending in ``;`` or ``&``)."""
    board = f"/run/tessera/priority/{uuid}"
    return (
        f"if [ -w {board} ]; then echo writable=1; else echo writable=0; fi; "
        f"if printf x >> {board} 2>/dev/null; then echo append=ok; else echo append=refused; fi; "
        f"{then} echo '{DONE}'; exec sleep 3600"
    )


def test_only_the_high_priority_pod_writes_the_board_and_the_low_one_is_held_while_it_runs(
    gpu_node: GpuNode, kube: client.ApiClient, granted_namespace: str
) -> None:
    namespace = granted_namespace
    uuid = gpu_node.gpu_uuid(0)
    # The high-priority pod keeps the GPU busy in the background for longer than the low one runs.
    # (The byte its append check adds lies past the board's 64 bytes, which still read as a board.)
    share_pod(
        kube,
        namespace,
        gpu_node,
        "high",
        {"priority": 0},
        board_script(uuid, "shim_probe duty 2000000 60 2 >/dev/null &"),
    )
    high_log = wait_done(kube, namespace, "high")
    assert "writable=1" in high_log and "append=ok" in high_log, high_log

    share_pod(kube, namespace, gpu_node, "low", None, board_script(uuid, "shim_probe duty 1000000 1 2;"))
    low_log = wait_done(kube, namespace, "low")
    assert "writable=0" in low_log and "append=refused" in low_log, low_log
    assert "launched=" in low_log, low_log

    core = client.CoreV1Api(kube)
    claim = generated_claim_name(core.read_namespaced_pod("low", namespace), "gpu")
    resource = client.ResourceV1Api(kube)
    assert claim is not None
    uid = raw_json(resource.read_namespaced_resource_claim(claim, namespace, _preload_content=False))[
        "metadata"
    ]["uid"]
    (usage,) = shim_format.read_region(gpu_node.driver.state_dir / "claims" / str(uid) / "usage").gpus
    assert usage.uuid == uuid and usage.holds > 0 and usage.held_ns > 0, usage
    board = shim_format.read_board(gpu_node.driver.state_dir / "priority" / uuid)
    assert board is not None and board.high_launches > 0


def test_enforcement_off_on_a_whole_gpu_runs_cuda_without_the_shim(
    gpu_node: GpuNode, kube: client.ApiClient, namespace: str
) -> None:
    script = (
        "echo '== info'; shim_probe info; "
        "echo '== preload'; cat /etc/ld.so.preload; "
        "echo '== shim'; for p in /run/tessera/shim /run/tessera/limits /run/tessera/usage; "
        "do if [ -e $p ]; then echo present=$p; fi; done; "
        f"echo '{DONE}'; exec sleep 3600"
    )
    whole = {"memory": "80Gi", "cores": "100"}
    share_pod(kube, namespace, gpu_node, "whole", {"enforcement": "off"}, script, gpu=1, capacity=whole)
    seen = sections(wait_done(kube, namespace, "whole"))
    assert int(seen["info"]["total"]) == 80 << 30, seen
    log = wait_done(kube, namespace, "whole")
    preload = log.split("== preload", 1)[1].split("== shim")[0].split()
    assert [p.rsplit("/", 1)[1] for p in preload] == ["libcuda.so.1", "libnvidia-ml.so.1"], log
    assert "tessera/shim" not in " ".join(preload)
    assert "present=" not in log.split("== shim", 1)[1], log
