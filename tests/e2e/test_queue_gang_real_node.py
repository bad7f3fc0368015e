"""The gang of the queue bar on a real node: real Kueue v0.17, the real scheduler, kubelet and
containerd, the node daemon over simulated GPUs, the webhook and the admission check.

Four GPUs of 48 GiB; pods outside the queue take 36 GiB of each (pinned by UUID), so each has 12 GiB
free. A Job of 4 pods of 20 GiB is not admitted and its Workload says why; when two of those pods
end, it is admitted, and all four of its pods run at once on the two freed GPUs. None of its pods
exists before admission, and no pod of the run is ever left unschedulable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import api_client
from tessera.quantity import GiB
from tessera.testbed import queue_bed
from tessera.testbed.cluster import LocalCluster
from tessera.testbed.driver_node import DriverNode, ensure_device_class
from tessera.testbed.kueue import KueueOptions
from tessera.testbed.node import NodeFactory, RealNode
from tessera.testbed.polling import poll_until
from tessera.watching import watch_forever
from tests.e2e.test_driver_node import PROBE_IMAGE, probe_image
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]

CHECK = "gpu-fit"
NAMESPACE = "gang-team"
SLEEP = ["/bin/sh", "-c", "sleep 3600"]


@dataclass
class GangBed:
    cluster: LocalCluster
    api: client.ApiClient
    node: RealNode
    unschedulable: dict[str, str]
    running_together: list[set[str]]

    def log_tails(self) -> dict[str, str]:
        return {**self.cluster.log_tails(60), **self.node.log_tails()}


@pytest.fixture(scope="module")
def bed(probe_image: Path) -> Iterator[GangBed]:
    if os.geteuid() != 0:
        pytest.skip("real nodes need root: containerd and the kubelet mount, and manage cgroups and links")
    options = KueueOptions(extra_config={"resources": queue_bed.KUEUE_RESOURCES})
    with LocalCluster(kueue=options) as cluster:
        api = api_client(cluster.admin_kubeconfig)
        ensure_device_class(api)
        factory = NodeFactory(cluster)
        [node] = factory.start(1, extra_images=[probe_image])
        driver = DriverNode(
            cluster,
            node.name,
            kubelet_root=node.paths.kubelet_root,
            cdi_dir=node.paths.cdi_dir,
            gpus=4,
            memory_bytes=48 * GiB,
        )
        unschedulable: dict[str, str] = {}
        together: list[set[str]] = []
        stop = threading.Event()
        webhook: RunningWebhook | None = None
        try:
            driver.start()
            driver.wait_ready()
            webhook = RunningWebhook(api, cluster)
            process, port = queue_bed.admission_check_process(cluster)
            process.wait_until(lambda: queue_bed.http_status(port, "/readyz") == 200, 120, "caches synced")
            queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", "gpus", {}))
            queue_bed.create(api, queue_bed.admission_check(CHECK))
            quota = {"nvidia.com/gpu": "100", queue_bed.GPU_MEMORY: "1000Gi", queue_bed.GPU_CORES: "10000"}
            queue_bed.create(api, queue_bed.cluster_queue("gang-cq", "gpus", quota, checks=[CHECK]))
            core = client.CoreV1Api(api)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
            poll_until(lambda: core.read_namespaced_service_account("default", NAMESPACE), 60, "default SA")
            queue_bed.create(api, queue_bed.local_queue("q", NAMESPACE, "gang-cq"))
            running: dict[str, bool] = {}

            def on_pod(kind: str, obj: Any) -> None:
                for pod in obj["items"] if kind == "SYNCED" else [obj]:
                    name = pod["metadata"]["name"]
                    for condition in (pod.get("status") or {}).get("conditions") or []:
                        if (
                            condition.get("type") == "PodScheduled"
                            and condition.get("reason") == "Unschedulable"
                        ):
                            unschedulable[name] = condition.get("message", "")
                    if pod["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == "gang":
                        running[name] = (
                            kind != "DELETED" and (pod.get("status") or {}).get("phase") == "Running"
                        )
                        together.append({n for n, up in running.items() if up})

            threading.Thread(
                target=watch_forever,
                args=(core.list_namespaced_pod, on_pod, stop, "pods"),
                kwargs={"namespace": NAMESPACE},
                daemon=True,
            ).start()
            yield GangBed(cluster, api, node, unschedulable, together)
        finally:
            stop.set()
            if webhook is not None:
                webhook.stop()
            driver.cleanup()
            factory.stop_all()


def filler(name: str, uuid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {"nvidia.com/use-gpuuuid": uuid}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "hold",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": SLEEP,
                    "resources": {"limits": {"nvidia.com/gpumem": str(36 * 1024)}},
                }
            ],
        },
    }


def phase(core: client.CoreV1Api, name: str) -> str | None:
    status = core.read_namespaced_pod(name, NAMESPACE).status
    return status.phase if status else None


def test_the_gang_waits_with_a_reason_then_runs_whole_on_real_gpus(bed: GangBed) -> None:
    api, core = bed.api, client.CoreV1Api(bed.api)
    uuids = queue_bed.published_uuids(api, bed.node.name)
    assert len(uuids) == 4
    for index, uuid in enumerate(uuids):
        core.create_namespaced_pod(NAMESPACE, client.V1Pod.model_validate(filler(f"filler-{index}", uuid)))
    for index in range(4):
        name = f"filler-{index}"
        poll_until(lambda name=name: phase(core, name) == "Running", 180, f"{name} running")  # type: ignore[misc]

    job = queue_bed.gpu_job("gang", "q", 4, 20 * 1024, image=PROBE_IMAGE, command=SLEEP)
    client.BatchV1Api(api).create_namespaced_job(NAMESPACE, client.V1Job.model_validate(job))
    workload = queue_bed.workload_of_job(api, NAMESPACE, "gang")["metadata"]["name"]

    def says_why() -> str | None:
        state = queue_bed.check_state(queue_bed.read_workload(api, NAMESPACE, workload), CHECK)
        return (
            state.get("message")
            if state.get("state") == "Pending" and "needs" in state.get("message", "")
            else None
        )

    message = poll_until(says_why, 90, "the gang's Pending message")
    assert message.startswith(
        f"needs 4 shares of 20Gi at once; the largest free share is 12Gi/100 on {bed.node.name}"
    ), message
    assert core.list_namespaced_pod(NAMESPACE, label_selector="batch.kubernetes.io/job-name=gang").items == []

    for index in (0, 1):
        core.delete_namespaced_pod(f"filler-{index}", NAMESPACE, grace_period_seconds=0)

    def admitted() -> bool:
        return queue_bed.has_condition(queue_bed.read_workload(api, NAMESPACE, workload), "Admitted")

    poll_until(admitted, 180, "the gang admitted once two GPUs are free")
    poll_until(
        lambda: any(len(up) == 4 for up in bed.running_together), 300, "all four gang pods running together"
    )
    # Every pod of the gang was placed (none waited unschedulable for a GPU), on the two freed GPUs.
    assert bed.unschedulable == {}, bed.unschedulable
