"""What Kueue v0.17 charges for a converted plain pod with its alpha DRA gate on (docs/queue.md):
the request's device count under the mapped name, never memory or cores; and a claim template with
CEL selectors (any use/nouse annotation) or a device constraint (several GPUs) makes the Workload
inadmissible."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import api_client
from testbed import queue_bed
from testbed.binaries import COMPONENTS
from testbed.cluster import LocalCluster
from testbed.kueue import KueueOptions
from testbed.names import unique_name
from testbed.polling import poll_until

pytestmark = pytest.mark.integration

SHARES = "tessera.dev/gpu-shares"
GATE_ON = KueueOptions(
    feature_gates={"DynamicResourceAllocation": True},
    extra_config={
        "resources": {"deviceClassMappings": [{"name": SHARES, "deviceClassNames": ["gpu.tessera.dev"]}]}
    },
)


@pytest.fixture(scope="module")
def gated() -> Iterator[tuple[LocalCluster, client.ApiClient, str]]:
    missing = [n for n in ("etcd", "kubernetes", "kueue") if COMPONENTS[n].missing()]
    if missing:
        pytest.fail(f"test-bed binaries not built ({', '.join(missing)}): run `make binaries`")
    with LocalCluster(kueue=GATE_ON) as cluster:
        api = api_client(cluster.admin_kubeconfig)
        queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", "gpus", {}))
        quota = {SHARES: "10", "nvidia.com/gpu": "10"}
        queue_bed.create(api, queue_bed.cluster_queue("dra-cq", "gpus", quota))
        namespace = unique_name("team")
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
        queue_bed.create(api, queue_bed.local_queue("q", namespace, "dra-cq"))
        yield cluster, api, namespace


def test_a_converted_pod_is_charged_its_share_count_not_its_memory(
    gated: tuple[LocalCluster, client.ApiClient, str],
) -> None:
    _, api, namespace = gated
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "20"}
    queue_bed.plain_gpu_pod(api, namespace, "counted", "q", limits)
    workload = queue_bed.workload_of_job(api, namespace, "counted", kind="Pod")["metadata"]["name"]

    def admitted() -> dict[str, Any] | None:
        current = queue_bed.read_workload(api, namespace, workload)
        return current if queue_bed.has_condition(current, "Admitted") else None

    done = poll_until(admitted, 90, "the pod's Workload admitted")
    (assignment,) = done["status"]["admission"]["podSetAssignments"]
    assert assignment["resourceUsage"] == {SHARES: "1"}


def inadmissible_because(api: client.ApiClient, namespace: str, pod: str, what: str) -> str:
    """The message of the condition in which Kueue refuses the pod's Workload as not supported."""
    workload = queue_bed.workload_of_job(api, namespace, pod, kind="Pod")["metadata"]["name"]

    def refused() -> str | None:
        current = queue_bed.read_workload(api, namespace, workload)
        for condition in (current.get("status") or {}).get("conditions") or []:
            if "not supported" in condition.get("message", ""):
                return str(condition["message"])
        return None

    return poll_until(refused, 90, f"Kueue refusing {what}")


def test_a_pod_asking_for_several_gpus_is_inadmissible(
    gated: tuple[LocalCluster, client.ApiClient, str],
) -> None:
    """nvidia.com/gpu: 2 means two different GPUs, which the claim says with a distinctAttribute
    constraint; v0.17's DRA path refuses any device constraint."""
    _, api, namespace = gated
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "20"}
    queue_bed.plain_gpu_pod(api, namespace, "several", "q", limits)
    message = inadmissible_because(api, namespace, "several", "the device constraint")
    assert "device constraints" in message and "not supported" in message, message


def test_a_template_with_selectors_is_inadmissible(gated: tuple[LocalCluster, client.ApiClient, str]) -> None:
    _, api, namespace = gated
    annotations = {"nvidia.com/use-gputype": "A100"}
    queue_bed.plain_gpu_pod(api, namespace, "selective", "q", {"nvidia.com/gpumem": "1024"}, annotations)
    message = inadmissible_because(api, namespace, "selective", "the selectors")
    assert "CEL selectors are not supported" in message, message
