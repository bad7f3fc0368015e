"""The admission check against the real API server and the real Kueue v0.17: Workloads of GPU Jobs
get Ready when their shares pack, stay Pending with a message that says why when they do not, and
are decided again when a ResourceSlice changes; work without a GPU is never held.

Nodes here are Node objects without a kubelet publishing the driver's slices (testbed/queue_bed.py);
no webhook runs, so the Jobs' pods keep their HAMi resources and are never placed: every Ready
Workload keeps its shares reserved, which is also what the reserved-share test relies on. Each test
pins its Jobs to its own GPUs with the use-gpuuuid annotation, so tests sharing the cluster do not
see each other's capacity.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from tessera.admissioncheck.controller import ARRIVAL_WINDOW_SECONDS
from tessera.gpu_request import GpuRequest, request_to_annotation
from tessera.kube import api_client, raw_json
from tessera.quantity import GiB, quantity_to_int
from testbed import queue_bed
from testbed.cluster import LocalCluster
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.process import ManagedProcess

pytestmark = pytest.mark.integration

CHECK = "gpu-fit"
FLAVOR = "default-flavor"
QUEUE = "gpus"
HUGE_QUOTA = {"nvidia.com/gpu": "1000", queue_bed.GPU_MEMORY: "100Ti", queue_bed.GPU_CORES: "100000"}


@dataclass
class QueueBed:
    cluster: LocalCluster
    api: client.ApiClient
    check: ManagedProcess
    health_port: int

    def log_tails(self) -> dict[str, str]:
        return self.cluster.log_tails(60)


@pytest.fixture(scope="module")
def bed(kueue_cluster: LocalCluster) -> QueueBed:
    api = api_client(kueue_cluster.admin_kubeconfig)
    process, port = queue_bed.ready_admission_check(kueue_cluster)
    queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", FLAVOR, {}))
    queue_bed.create(api, queue_bed.admission_check(CHECK))
    queue_bed.create(api, queue_bed.cluster_queue("gpu-cq", FLAVOR, HUGE_QUOTA, checks=[CHECK]))
    return QueueBed(kueue_cluster, api, process, port)


@pytest.fixture
def team(bed: QueueBed) -> Iterator[str]:
    """A namespace with a LocalQueue named ``gpus`` on the checked ClusterQueue."""
    core = client.CoreV1Api(bed.api)
    name = unique_name("team")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    queue_bed.create(bed.api, queue_bed.local_queue(QUEUE, name, "gpu-cq"))
    yield name
    batch = client.BatchV1Api(bed.api)
    for job in batch.list_namespaced_job(name).items:
        batch.delete_namespaced_job(
            str(job.metadata and job.metadata.name), name, propagation_policy="Background"
        )


@pytest.fixture
def node(bed: QueueBed) -> Callable[..., tuple[str, list[str]]]:
    def make(*memories_gi: int) -> tuple[str, list[str]]:
        name = unique_name("gpu-node")
        return name, queue_bed.gpu_node(bed.api, name, memories_gi)

    return make


def submit(bed: QueueBed, namespace: str, job: dict[str, Any]) -> str:
    client.BatchV1Api(bed.api).create_namespaced_job(namespace, client.V1Job.model_validate(job))
    return str(queue_bed.workload_of_job(bed.api, namespace, job["metadata"]["name"])["metadata"]["name"])


def wait_for_state(
    bed: QueueBed, namespace: str, workload: str, state: str, timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        current = queue_bed.read_workload(bed.api, namespace, workload)
        return current if queue_bed.check_state(current, CHECK).get("state") == state else None

    try:
        found: dict[str, Any] = poll_until(check, timeout, f"Workload {workload} {state} on {CHECK}")
    except TimeoutError as error:
        current = queue_bed.read_workload(bed.api, namespace, workload)
        raise AssertionError(f"{error}: status {json.dumps(current.get('status'), indent=1)}") from error
    return found


def suspended(bed: QueueBed, namespace: str, job: str) -> bool | None:
    spec = client.BatchV1Api(bed.api).read_namespaced_job(job, namespace).spec
    return spec.suspend if spec else None


def pinned(uuids: list[str]) -> dict[str, str]:
    return {"nvidia.com/use-gpuuuid": ",".join(uuids)}


def test_our_admission_check_is_marked_active(bed: QueueBed) -> None:
    custom = client.CustomObjectsApi(bed.api)

    def active() -> bool:
        check = raw_json(
            custom.get_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "admissionchecks", CHECK, _preload_content=False
            )
        )
        conditions = (check.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

    poll_until(active, 60, "AdmissionCheck Active")
    assert queue_bed.http_status(bed.health_port, "/healthz") == 200


def test_a_job_whose_shares_fit_is_admitted_and_unsuspended(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    name, uuids = node(80)
    job = queue_bed.gpu_job("fits", QUEUE, 2, 20 * 1024, 30, annotations=pinned(uuids))
    workload = submit(bed, team, job)
    ready = wait_for_state(bed, team, workload, "Ready")
    assert f"2 pods on {name}" in queue_bed.check_state(ready, CHECK)["message"]

    def admitted() -> dict[str, Any] | None:
        current = queue_bed.read_workload(bed.api, team, workload)
        return current if queue_bed.has_condition(current, "Admitted") else None

    done = poll_until(admitted, 60, "Admitted")
    # Kueue charged the memory and cores of both pods through the documented transformations.
    (assignment,) = done["status"]["admission"]["podSetAssignments"]
    usage = assignment["resourceUsage"]
    assert quantity_to_int(usage[queue_bed.GPU_MEMORY]) == 2 * 20 * 1024 * 2**20
    assert quantity_to_int(usage[queue_bed.GPU_CORES]) == 60
    assert quantity_to_int(usage["nvidia.com/gpu"]) == 2
    poll_until(
        lambda: suspended(bed, team, "fits") is False,
        60,
        "Job unsuspended",
    )


def test_a_gang_that_only_fits_as_a_sum_waits_with_a_message_and_is_retried_when_gpus_appear(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    """Four pods of 20Gi/30 and four GPUs of 12Gi: 48Gi free in total, yet no GPU holds one share.
    The Workload waits and says so; a slice change adds two 48Gi GPUs and it is Ready."""
    name, small = node(12, 12, 12, 12)
    big = [f"GPU-{name}-4", f"GPU-{name}-5"]
    job = queue_bed.gpu_job("gang", QUEUE, 4, 20 * 1024, 30, annotations=pinned(small + big))
    workload = submit(bed, team, job)

    message = poll_until(
        lambda: queue_bed.fit_refusal(bed.api, team, workload, CHECK), 60, "a Pending message"
    )
    assert message.startswith(
        f"needs 4 shares of 20Gi/30 at once; the largest free share is 12Gi/100 on {name}"
    ), message
    assert not queue_bed.has_condition(queue_bed.read_workload(bed.api, team, workload), "Admitted")
    assert suspended(bed, team, "gang") is True

    # The same node's slice now also has two 48Gi GPUs: two pods fit on each.
    queue_bed.publish_gpus(bed.api, name, [12, 12, 12, 12, 48, 48])
    ready = wait_for_state(bed, team, workload, "Ready")
    assert f"4 pods on {name}" in queue_bed.check_state(ready, CHECK)["message"]


def test_a_gpu_cordoned_by_a_device_taint_rule_is_never_counted_free_and_its_removal_admits(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    """Two pods of 50Gi need both 80Gi GPUs of the node; a DeviceTaintRule (as docs/driver.md
    writes one) cordons GPU 0, so the scheduler would refuse one pod: the Workload waits and says
    why, and is Ready once the rule is deleted."""
    name, uuids = node(80, 80)
    device = queue_bed.gpu_devices(name, [80, 80])[0]["name"]
    rule_name = unique_name("cordon")
    rule: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name},
        "spec": {
            "deviceSelector": {"driver": "gpu.tessera.dev", "pool": name, "device": device},
            "taint": {"key": "gpu.tessera.dev/cordoned", "value": "maintenance", "effect": "NoSchedule"},
        },
    }
    resource = client.ResourceV1Api(bed.api)
    resource.create_device_taint_rule(client.V1DeviceTaintRule.model_validate(rule))
    try:
        job = queue_bed.gpu_job("cordoned", QUEUE, 2, 50 * 1024, annotations=pinned(uuids))
        workload = submit(bed, team, job)
        message = poll_until(
            lambda: queue_bed.fit_refusal(bed.api, team, workload, CHECK), 60, "a Pending message"
        )
        assert message.startswith("needs 2 shares of 50Gi"), message
        assert "the largest free share is 80Gi/100" in message, message
        assert suspended(bed, team, "cordoned") is True
    finally:
        resource.delete_device_taint_rule(rule_name)
    ready = wait_for_state(bed, team, workload, "Ready")
    assert f"2 pods on {name}" in queue_bed.check_state(ready, CHECK)["message"]


def test_shares_of_a_ready_workload_not_yet_placed_are_not_given_twice(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    _, uuids = node(80)
    first = submit(bed, team, queue_bed.gpu_job("first", QUEUE, 1, 50 * 1024, annotations=pinned(uuids)))
    wait_for_state(bed, team, first, "Ready")
    second = submit(bed, team, queue_bed.gpu_job("second", QUEUE, 1, 50 * 1024, annotations=pinned(uuids)))

    message = poll_until(
        lambda: queue_bed.fit_refusal(bed.api, team, second, CHECK), 60, "second Workload's Pending message"
    )
    assert "needs 1 share of 50Gi" in message and "the largest free share is 30Gi/100" in message, message
    # The first Job goes away: its reservation with it, and the second one is decided again.
    client.BatchV1Api(bed.api).delete_namespaced_job("first", team, propagation_policy="Background")
    wait_for_state(bed, team, second, "Ready")


def test_pods_that_never_come_hold_their_node_only_for_the_arrival_window(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    """The first Workload's pods are never placed here (no webhook converts them). The second,
    which only that node holds, waits for them, and is decided again when the first's arrival
    window ends, with nothing else changing: no watch event wakes the check, its own timer does."""
    _, uuids = node(80)
    first = submit(bed, team, queue_bed.gpu_job("first", QUEUE, 1, 20 * 1024, annotations=pinned(uuids)))
    wait_for_state(bed, team, first, "Ready")
    second = submit(bed, team, queue_bed.gpu_job("second", QUEUE, 1, 20 * 1024, annotations=pinned(uuids)))

    def waits_for_arrival() -> str | None:
        state = queue_bed.check_state(queue_bed.read_workload(bed.api, team, second), CHECK)
        message = str(state.get("message", ""))
        return message if state.get("state") == "Pending" and "already admitted there" in message else None

    message = poll_until(waits_for_arrival, 60, "the second Workload waiting for the first's pods")
    assert message.startswith("waiting: fits on gpu-node-"), message
    ready = wait_for_state(bed, team, second, "Ready", timeout=ARRIVAL_WINDOW_SECONDS + 30)
    assert "1 pod on gpu-node-" in queue_bed.check_state(ready, CHECK)["message"]


def test_work_without_a_gpu_is_never_held(bed: QueueBed, team: str) -> None:
    job = queue_bed.gpu_job("cpu-only", QUEUE, 3, None, gpus=0)
    workload = submit(bed, team, job)
    ready = wait_for_state(bed, team, workload, "Ready")
    assert queue_bed.check_state(ready, CHECK)["message"] == "asks for no GPU"


def test_an_invalid_gpu_request_is_rejected_with_the_webhooks_sentence(bed: QueueBed, team: str) -> None:
    """Watched, not polled: Kueue deactivates a rejected Workload and resets the check to Pending
    within a moment, which a poll of the object missed on a loaded machine."""
    history = queue_bed.CheckHistory(bed.api, team, CHECK)
    try:
        workload = submit(bed, team, queue_bed.gpu_job("bad", QUEUE, 1, 1024, 250))
        rejected = poll_until(
            lambda: history.first(workload, "Rejected"), 60, f"Workload {workload} Rejected"
        )
    finally:
        history.stop()
    assert "gpucores is 250" in rejected[1]


def test_a_plain_pod_is_checked_from_its_claim_template_and_v017_without_its_dra_gate_charges_no_gpu(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    name, uuids = node(40)
    queue_bed.plain_gpu_pod(
        bed.api,
        team,
        "plain",
        QUEUE,
        {"nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "20"},
        pinned(uuids),
    )
    workload = str(queue_bed.workload_of_job(bed.api, team, "plain", kind="Pod")["metadata"]["name"])
    ready = wait_for_state(bed, team, workload, "Ready")
    assert queue_bed.check_state(ready, CHECK)["message"] == f"fits: 1 pod on {name}"

    def admitted() -> dict[str, Any] | None:
        current = queue_bed.read_workload(bed.api, team, workload)
        return current if queue_bed.has_condition(current, "Admitted") else None

    done = poll_until(admitted, 60, "the plain pod's Workload admitted")
    (assignment,) = done["status"]["admission"]["podSetAssignments"]
    charged = set(assignment.get("resourceUsage") or {})
    assert not charged & {"nvidia.com/gpu", queue_bed.GPU_MEMORY, queue_bed.GPU_CORES}, charged


def test_a_template_a_tenant_wrote_with_a_forged_small_record_is_rejected_not_admitted(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    """From where a tenant stands: its own ResourceClaimTemplate, created through the API, asks for
    30 GiB while its gpu-request annotation claims 1 GiB, so that a fit check trusting the record
    would admit it where it does not fit. The check compares the two and rejects the Workload."""
    _, uuids = node(40)
    forged = request_to_annotation(GpuRequest(count=1, memory=GiB, memory_percent=None, cores=20))
    history = queue_bed.CheckHistory(bed.api, team, CHECK)
    try:
        queue_bed.plain_gpu_pod(
            bed.api,
            team,
            "forged",
            QUEUE,
            {"nvidia.com/gpumem": "30720", "nvidia.com/gpucores": "20"},
            pinned(uuids),
            record=forged,
        )
        workload = str(queue_bed.workload_of_job(bed.api, team, "forged", kind="Pod")["metadata"]["name"])
        rejected = poll_until(
            lambda: history.first(workload, "Rejected"), 60, f"Workload {workload} Rejected"
        )
        assert history.first(workload, "Ready") is None, "never admitted on the forged record"
    finally:
        history.stop()
    assert "asks for other GPU shares than its annotation" in rejected[1]


def test_a_webhook_template_with_a_selector_added_by_hand_is_admitted_naming_it_as_not_judged(
    bed: QueueBed, team: str, node: Callable[..., tuple[str, list[str]]]
) -> None:
    """From where a tenant stands: the webhook's template for a 10 GiB share, with the webhook's
    label and record, plus one CEL selector of its own. The record does not imply that selector, so
    the check does not trust the record's selection: it reads the template by its structure and
    names every selector it could not judge, the added one among them."""
    node(40)
    extra = 'device.attributes["gpu.tessera.dev"].index == 0'
    queue_bed.plain_gpu_pod(
        bed.api, team, "added", QUEUE, {"nvidia.com/gpumem": "10240"}, extra_selector=extra
    )
    workload = str(queue_bed.workload_of_job(bed.api, team, "added", kind="Pod")["metadata"]["name"])
    ready = wait_for_state(bed, team, workload, "Ready")
    message = queue_bed.check_state(ready, CHECK)["message"]
    assert "selectors not judged here: " in message and extra in message, message


def test_sigterm_stops_the_command_cleanly(bed: QueueBed) -> None:
    """Runs last in this module: the command exits 0 on SIGTERM."""
    bed.check.stop(grace=30)
    assert bed.check.returncode == 0
    assert "stopped after" in bed.check.log_tail(5)
