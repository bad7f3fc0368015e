"""Static MIG on a real node: one simulated GPU in MIG mode, one whole. The daemon publishes the
instances and the other GPU as a share; a pod written for HAMi, asking ``nvidia.com/mig-1g.10gb: 1``,
is converted by the webhook and runs on an instance through the real kubelet and containerd and sees
only that instance's memory, with no shim, while a share pod keeps running on the other GPU; a
mode switch while the daemon runs republishes the slice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from simgpu.config import GiB, mig_instances
from tessera.kube import raw_json
from tessera.names import MIG_DEVICE_CLASS
from tessera.quantity import MiB, quantity_to_int
from tessera.slices import published_gpus
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_mig_device_class
from testbed.node import NodeFactory
from testbed.pod_state import sections
from testbed.polling import poll_until
from tests.e2e.test_driver_node import (
    DONE,
    PROBE_IMAGE,
    GpuNode,
    claim_of,
    limit_script,
    one_gpu_node,
    probe_image,
    run_share_pod,
    wait_done,
)
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]

PROFILES = (("1g.10gb", 10 * GiB), ("1g.10gb", 10 * GiB), ("3g.40gb", 40 * GiB))


@pytest.fixture(scope="module")
def mig_node(
    cluster: LocalCluster, kube: client.ApiClient, node_factory: NodeFactory, probe_image: Path
) -> Iterator[GpuNode]:
    """A real node with two simulated 80 GiB GPUs: GPU 0 in MIG mode (1g.10gb twice, 3g.40gb), GPU 1
    whole; the daemon registered and published."""
    made_class = ensure_mig_device_class(kube)

    def mig_on_first_gpu(driver: DriverNode) -> None:
        first, second = driver.simgpu.spec.gpus
        first = replace(first, mig_mode=True, mig=mig_instances(first.uuid, PROFILES))
        driver.simgpu.update(replace(driver.simgpu.spec, gpus=(first, second)))

    try:
        with one_gpu_node(cluster, kube, node_factory, probe_image, mig_on_first_gpu) as gpu_node:
            yield gpu_node
    finally:
        if made_class:  # a chart installed later in the session owns it then
            client.ResourceV1Api(kube).delete_device_class(MIG_DEVICE_CLASS)


def node_slice(kube: client.ApiClient, node: str) -> dict[str, Any]:
    """The node's one slice. The kubelet may delete it at any time (when it starts, or 30 s after a
    registration of the daemon timed out on a loaded machine) and the daemon puts it back within
    moments (tessera/driver/slices.py), so a moment without it is waited out, not taken as the
    answer."""

    def published() -> dict[str, Any] | None:
        items = raw_json(
            client.ResourceV1Api(kube).list_resource_slice(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            )
        )["items"]
        assert len(items) <= 1, f"one slice per node, found {len(items)}"
        return dict(items[0]) if items else None

    return poll_until(published, 60, f"the slice of {node}")


def kinds(published: dict[str, Any]) -> list[tuple[str, str]]:
    """(type, profile or GPU UUID) of each device, in slice order."""
    out = []
    for device in published["spec"]["devices"]:
        attributes = device["attributes"]
        kind = attributes["type"]["string"]
        out.append((kind, attributes["profile" if kind == "mig" else "uuid"]["string"]))
    return out


def test_the_slice_has_the_instances_and_the_other_gpu_as_a_share(
    mig_node: GpuNode, kube: client.ApiClient
) -> None:
    """Three exclusive MIG devices with profile, UUID, parent and memory, then GPU 1 as a share; the
    shared reader (webhook fleet, admission check) sees GPU 1 alone."""
    published = node_slice(kube, mig_node.name)
    gpu0, gpu1 = mig_node.driver.simgpu.spec.gpus
    assert kinds(published) == [
        ("mig", "1g.10gb"),
        ("mig", "1g.10gb"),
        ("mig", "3g.40gb"),
        ("gpu", gpu1.uuid),
    ]
    for device, instance in zip(published["spec"]["devices"], gpu0.mig, strict=False):
        assert "allowMultipleAllocations" not in device
        assert device["attributes"]["uuid"] == {"string": instance.uuid}
        assert device["attributes"]["parentUUID"] == {"string": gpu0.uuid}
        assert quantity_to_int(device["capacity"]["memory"]["value"]) == instance.memory_bytes
    assert [g.uuid for g in published_gpus([published])] == [gpu1.uuid]


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster, kube: client.ApiClient, mig_node: GpuNode) -> Iterator[RunningWebhook]:
    running = RunningWebhook(kube, cluster)
    yield running
    running.stop()


def mig_pod(
    kube: client.ApiClient, namespace: str, node: GpuNode, name: str, profile: str, script: str
) -> dict[str, Any]:
    """A pod as a HAMi user writes it, asking ``nvidia.com/mig-<profile>: 1`` and running ``script``
    in the probe image; created through the API server, so the webhook converts it. Returns the pod
    as stored."""
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "probe",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}},
                }
            ],
        },
    }
    return dict(
        raw_json(
            client.CoreV1Api(kube).create_namespaced_pod(
                namespace, client.V1Pod.model_validate(pod), _preload_content=False
            )
        )
    )


def test_a_mig_pod_sees_only_its_instance_while_a_share_keeps_running_on_the_other_gpu(
    mig_node: GpuNode, webhook: RunningWebhook, kube: client.ApiClient, namespace: str
) -> None:
    """The share pod (20Gi, 30 cores on GPU 1) starts first and stays within its claim; the MIG pod,
    written for HAMi (``nvidia.com/mig-1g.10gb: 1``), is converted by the webhook and allocated a
    1g.10gb instance, sees 10 GiB as the device's total and free memory, cannot
    allocate past it (CUDA_ERROR_OUT_OF_MEMORY from the simulated hardware, not a shim: none is
    preloaded), can allocate all of it, and names its instance in CUDA_VISIBLE_DEVICES."""
    gpu0, gpu1 = mig_node.driver.simgpu.spec.gpus
    run_share_pod(
        kube,
        namespace,
        mig_node,
        "share",
        [{"memory": "20Gi", "cores": "30"}],
        limit_script(20 * GiB),
        gpu1.uuid,
    )
    instance_memory = 10 * GiB
    script = (
        "echo '== info'; shim_probe info; "
        f"echo '== over'; shim_probe alloc mem {instance_memory + 64 * MiB}; "
        f"echo '== fits'; shim_probe alloc mem {instance_memory}; "
        'echo "== env"; echo "visible=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES"; '
        "echo '== preload'; if [ -e /etc/ld.so.preload ]; then echo preload=yes; else echo preload=no; fi; "
        f"echo '{DONE}'; exec sleep 3600"
    )
    webhook.wait_effective(namespace)
    created = mig_pod(kube, namespace, mig_node, "mig", "1g.10gb", script)
    (container,) = created["spec"]["containers"]
    assert "nvidia.com/mig-1g.10gb" not in (container["resources"].get("limits") or {})
    assert container["resources"]["claims"] == [{"name": "tessera-probe"}]
    log = wait_done(kube, namespace, "mig")
    seen = sections(log)
    assert "total" in seen["info"], log
    assert (int(seen["info"]["total"]), int(seen["info"]["devtotal"])) == (
        instance_memory,
        instance_memory,
    ), seen
    assert int(seen["info"]["free"]) == instance_memory, seen
    assert (seen["over"]["rc"], seen["fits"]["rc"]) == ("2", "0"), seen
    assert seen["preload"]["preload"] == "no", seen
    (result,) = claim_of(kube, namespace, "mig", "tessera-probe")["status"]["allocation"]["devices"][
        "results"
    ]
    allocated = next(i for i in gpu0.mig if result["device"] == "mig-" + i.uuid.lower().removeprefix("mig-"))
    assert allocated.profile == "1g.10gb"
    assert seen["env"] == {"visible": allocated.uuid, "nvidia": allocated.uuid}, seen
    claim_uid = claim_of(kube, namespace, "mig", "tessera-probe")["metadata"]["uid"]
    spec_file = mig_node.node.paths.cdi_dir / f"k8s.gpu.tessera.dev-claim_{claim_uid}.json"
    mounted = [m["containerPath"] for m in json.loads(spec_file.read_text())["containerEdits"]["mounts"]]
    assert not [m for m in mounted if m.startswith("/run/tessera")]

    share = sections(wait_done(kube, namespace, "share"))
    assert int(share["info"]["total"]) == 20 * GiB and share["over"]["rc"] == "2", share
    status = client.CoreV1Api(kube).read_namespaced_pod("share", namespace).status
    assert status is not None and status.phase == "Running"


def test_a_mode_switch_while_the_daemon_runs_republishes(mig_node: GpuNode, kube: client.ApiClient) -> None:
    """GPU 0 switched out of MIG mode: the slice soon shows it as a share instead of its instances
    (a newer pool generation); switched back, the instances return."""
    simgpu = mig_node.driver.simgpu
    gpu0, gpu1 = simgpu.spec.gpus
    before = node_slice(kube, mig_node.name)
    try:
        simgpu.update(replace(simgpu.spec, gpus=(replace(gpu0, mig_mode=False), gpu1)))
        as_shares = [("gpu", gpu0.uuid), ("gpu", gpu1.uuid)]

        def switched() -> dict[str, Any] | None:
            published = node_slice(kube, mig_node.name)
            return published if kinds(published) == as_shares else None

        after = poll_until(switched, 60, "GPU 0 published as a share")
        assert after["spec"]["pool"]["generation"] > before["spec"]["pool"]["generation"]
    finally:
        simgpu.update(replace(simgpu.spec, gpus=(gpu0, gpu1)))
    poll_until(
        lambda: kinds(node_slice(kube, mig_node.name)) == kinds(before), 60, "the instances published again"
    )
