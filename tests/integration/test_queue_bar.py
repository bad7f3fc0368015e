"""The queue-admission bar, end to end on the control plane: real Kueue v0.17, the real scheduler,
controller manager and Job controller, the real webhook converting the Jobs' pods, and the admission
check as its own command.

What is simulated, and how: the nodes are Node objects without a kubelet (testbed/fake_nodes.py)
publishing the driver's ResourceSlices for simulated GPUs (testbed/queue_bed.py). The scheduler
really allocates the claims and binds the pods to them; nothing runs the containers, so a test ends
a Job's pods by writing their status as a kubelet would (phase Succeeded), and the Job controller,
Kueue and the claim controller react as they would to a real node. Real-node runs (kubelet,
containerd, simulated GPU libraries) of these scenarios are not part of this file.

A watcher sees every pod of the module from start to end; the last test asserts that no pod of an
admitted Workload was ever left unschedulable (the scheduler's PodScheduled=False), i.e. nothing
was admitted that could not be placed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import api_client, raw_json
from tessera.watching import watch_forever
from testbed import pod_state, queue_bed
from testbed.cluster import LocalCluster
from testbed.driver_node import ensure_device_class
from testbed.fake_nodes import report_exit, report_succeeded
from testbed.names import unique_name
from testbed.polling import poll_until
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.integration

CHECK = "gpu-fit"
FLAVOR = "gpus"
GiB_MIB = 1024
PRIORITIES = {"production": 1000, "interactive": 500, "batch": 100}


@dataclass
class PodWatcher:
    """Every pod event of the run: which pods were ever unschedulable, and when pods appeared."""

    unschedulable: dict[str, str] = field(default_factory=dict)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, kind: str, obj: Any) -> None:
        items = obj["items"] if kind == "SYNCED" else [obj]
        with self.lock:
            for pod in items:
                key = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
                self.seen[key] = pod
                for condition in (pod.get("status") or {}).get("conditions") or []:
                    if (
                        condition.get("type") == "PodScheduled"
                        and condition.get("status") == "False"
                        and condition.get("reason") == "Unschedulable"
                    ):
                        self.unschedulable[key] = condition.get("message", "")


@dataclass
class Bar:
    cluster: LocalCluster
    api: client.ApiClient
    watcher: PodWatcher
    webhook: RunningWebhook

    def log_tails(self) -> dict[str, str]:
        return self.cluster.log_tails(60)


@pytest.fixture(scope="module")
def bar(kueue_cluster: LocalCluster) -> Iterator[Bar]:
    api = api_client(kueue_cluster.admin_kubeconfig)
    queue_bed.ready_admission_check(kueue_cluster)
    ensure_device_class(api)
    queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", FLAVOR, {}))
    queue_bed.create(api, queue_bed.admission_check(CHECK))
    for name, value in PRIORITIES.items():
        queue_bed.create(api, queue_bed.priority_class(name, value))
    watcher = PodWatcher()
    stop = threading.Event()
    thread = threading.Thread(
        target=watch_forever,
        args=(client.CoreV1Api(api).list_pod_for_all_namespaces, watcher.handle, stop, "pods"),
        daemon=True,
    )
    thread.start()
    webhook = RunningWebhook(api, kueue_cluster)
    try:
        yield Bar(kueue_cluster, api, watcher, webhook)
    finally:
        stop.set()
        webhook.stop()


@pytest.fixture
def nodes(bar: Bar) -> Iterator[Callable[..., str]]:
    """GPU nodes for one test; their slices and Nodes are deleted at the end, so the next test
    starts from no capacity."""
    made: list[str] = []

    def make(*memories_gi: int) -> str:
        name = unique_name("gpu-node")
        queue_bed.gpu_node(bar.api, name, memories_gi)
        made.append(name)
        return name

    yield make
    resource, core = client.ResourceV1Api(bar.api), client.CoreV1Api(bar.api)
    for name in made:
        with contextlib.suppress(ApiException):
            resource.delete_resource_slice(f"{name}-gpu.tessera.dev")
        with contextlib.suppress(ApiException):
            core.delete_node(name)


@pytest.fixture
def namespaces(bar: Bar) -> Iterator[Callable[[str], str]]:
    """Namespaces with a LocalQueue ``q`` on a given ClusterQueue; their Jobs are deleted at the end."""
    made: list[str] = []
    core = client.CoreV1Api(bar.api)

    def make(cluster_queue: str) -> str:
        name = unique_name("team")
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        queue_bed.create(bar.api, queue_bed.local_queue("q", name, cluster_queue))
        made.append(name)
        return name

    yield make
    batch = client.BatchV1Api(bar.api)
    for name in made:
        for job in batch.list_namespaced_job(name).items:
            if job.metadata and job.metadata.name:
                batch.delete_namespaced_job(job.metadata.name, name, propagation_policy="Background")
        for pod in core.list_namespaced_pod(name).items:
            if pod.metadata and pod.metadata.name:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)


def quota(memory_gi: int) -> dict[str, str]:
    return {"nvidia.com/gpu": "100", queue_bed.GPU_MEMORY: f"{memory_gi}Gi", queue_bed.GPU_CORES: "10000"}


def submit(
    bar: Bar, namespace: str, name: str, pods: int, memory_gi: int, priority: str, **kwargs: Any
) -> str:
    job = queue_bed.gpu_job(name, "q", pods, memory_gi * GiB_MIB, priority=priority, **kwargs)
    client.BatchV1Api(bar.api).create_namespaced_job(namespace, client.V1Job.model_validate(job))
    return str(queue_bed.workload_of_job(bar.api, namespace, name)["metadata"]["name"])


def admitted(bar: Bar, namespace: str, workload: str) -> bool:
    return queue_bed.has_condition(queue_bed.read_workload(bar.api, namespace, workload), "Admitted")


def job_pods(bar: Bar, namespace: str, job: str) -> list[client.V1Pod]:
    return list(
        client.CoreV1Api(bar.api)
        .list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={job}")
        .items
    )


def wait_running(bar: Bar, namespace: str, job: str, pods: int, timeout: float = 90) -> list[str]:
    """Wait until the Job's pods are all bound (claims allocated by the scheduler); their nodes."""

    def bound() -> list[str] | None:
        found = [p.spec.node_name for p in job_pods(bar, namespace, job) if p.spec and p.spec.node_name]
        return found if len(found) == pods else None

    try:
        nodes: list[str] = poll_until(bound, timeout, f"{pods} pods of {namespace}/{job} bound")
    except TimeoutError as error:
        found = [
            (p.metadata and p.metadata.name, p.status and p.status.phase, p.status and p.status.conditions)
            for p in job_pods(bar, namespace, job)
        ]
        job_status = client.BatchV1Api(bar.api).read_namespaced_job(job, namespace).status
        raise AssertionError(f"{error}; pods: {found}; job status: {job_status}") from error
    return nodes


def finish(bar: Bar, namespace: str, job: str) -> None:
    """End the Job's pods as a kubelet would report containers that exited 0."""
    core = client.CoreV1Api(bar.api)
    for pod in job_pods(bar, namespace, job):
        assert pod.metadata and pod.metadata.name
        report_succeeded(core, namespace, pod.metadata.name, "work")


def pending_in(bar: Bar, cluster_queue: str) -> int:
    body = raw_json(
        client.CustomObjectsApi(bar.api).get_cluster_custom_object(
            queue_bed.GROUP, queue_bed.VERSION, "clusterqueues", cluster_queue, _preload_content=False
        )
    )
    return int((body.get("status") or {}).get("pendingWorkloads") or 0)


def admitted_set(bar: Bar, namespace: str, workloads: dict[str, str]) -> set[str]:
    return {job for job, workload in workloads.items() if admitted(bar, namespace, workload)}


def test_jobs_beyond_the_memory_quota_wait_and_are_admitted_in_priority_then_fifo_order(
    bar: Bar, nodes: Callable[..., str], namespaces: Callable[[str], str]
) -> None:
    nodes(80, 80)
    queue_bed.create(
        bar.api,
        queue_bed.cluster_queue(
            "quota-cq",
            FLAVOR,
            quota(40),
            checks=[CHECK],
            strategy="StrictFIFO",
            preemption={"withinClusterQueue": "Never"},
        ),
    )
    ns = namespaces("quota-cq")
    workloads = {job: submit(bar, ns, job, 1, 20, "batch") for job in ("a", "b")}
    poll_until(lambda: admitted_set(bar, ns, workloads) == {"a", "b"}, 90, "a and b admitted")
    wait_running(bar, ns, "a", 1)
    wait_running(bar, ns, "b", 1)
    # Over quota now: c (batch), then d (interactive), then e (batch) wait.
    for job, priority in (("c", "batch"), ("d", "interactive"), ("e", "batch")):
        workloads[job] = submit(bar, ns, job, 1, 20, priority)
        queue_bed.after_creation_second(bar.api, ns, workloads[job])  # FIFO needs distinct seconds
    poll_until(lambda: pending_in(bar, "quota-cq") == 3, 60, "c, d and e pending in the ClusterQueue")
    assert admitted_set(bar, ns, workloads) == {"a", "b"}

    order = []
    for done in ("a", "b", "d"):
        before = admitted_set(bar, ns, workloads)
        finish(bar, ns, done)

        def newly_admitted(before: set[str] = before) -> set[str]:
            return admitted_set(bar, ns, workloads) - before

        new = poll_until(newly_admitted, 90, f"an admission after {done} finished")
        assert len(new) == 1, new
        (job,) = new
        order.append(job)
        wait_running(bar, ns, job, 1)
    assert order == ["d", "c", "e"], "priority first (interactive d), then FIFO among batch (c before e)"


def test_a_borrower_is_preempted_when_the_lender_reclaims_its_quota(
    bar: Bar, nodes: Callable[..., str], namespaces: Callable[[str], str]
) -> None:
    nodes(40, 40)
    preemption = {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
    for cq in ("lender-cq", "borrower-cq"):
        queue_bed.create(
            bar.api,
            queue_bed.cluster_queue(
                cq, FLAVOR, quota(40), checks=[CHECK], cohort="pool", preemption=preemption
            ),
        )
    lender, borrower = namespaces("lender-cq"), namespaces("borrower-cq")
    # The borrower's own Job outranks its borrowing one, so Kueue's choice of victim is by priority
    # (between equal priorities it goes by admission time, which Kueue records to the second).
    own = submit(bar, borrower, "own", 1, 40, "interactive")
    borrowed = submit(bar, borrower, "borrowed", 1, 40, "batch")
    poll_until(
        lambda: admitted(bar, borrower, own) and admitted(bar, borrower, borrowed), 90, "both admitted"
    )
    wait_running(bar, borrower, "own", 1)
    wait_running(bar, borrower, "borrowed", 1)
    assert (
        queue_bed.read_workload(bar.api, borrower, borrowed)["status"]["admission"]["clusterQueue"]
        == "borrower-cq"
    )

    reclaim = submit(bar, lender, "reclaim", 1, 40, "production")
    # Kueue preempts the borrowing Job; the check admits the lender only once the GPU share is free.
    poll_until(lambda: admitted(bar, lender, reclaim), 120, "the lender's Job admitted")
    preempted = queue_bed.read_workload(bar.api, borrower, borrowed)
    assert not queue_bed.has_condition(preempted, "Admitted")
    assert any(
        c.get("type") in ("Preempted", "Evicted") and c.get("status") == "True"
        for c in preempted["status"].get("conditions", [])
    )
    assert admitted(bar, borrower, own), "the borrower's Job within its own quota keeps running"
    wait_running(bar, lender, "reclaim", 1)


def test_a_gang_is_held_until_all_of_it_fits_and_then_placed_whole(
    bar: Bar, nodes: Callable[..., str], namespaces: Callable[[str], str]
) -> None:
    node = nodes(48, 48, 48, 48)
    queue_bed.create(bar.api, queue_bed.cluster_queue("gang-cq", FLAVOR, quota(1000), checks=[CHECK]))
    ns = namespaces("gang-cq")
    # Outside the queue, four pods take 36Gi of each GPU (pinned by UUID): 12Gi free on each.
    core = client.CoreV1Api(bar.api)
    for index in range(4):
        filler = queue_bed.gpu_job(f"filler-{index}", "none", 1, 36 * GiB_MIB)["spec"]["template"]
        filler["metadata"] = {
            "name": f"filler-{index}",
            "annotations": {"nvidia.com/use-gpuuuid": f"GPU-{node}-{index}"},
        }
        core.create_namespaced_pod(ns, client.V1Pod.model_validate(filler))
    for index in range(4):
        pod_state.wait_until_bound(core, ns, f"filler-{index}")

    gang = submit(bar, ns, "gang", 4, 20, "batch")

    message = poll_until(
        lambda: queue_bed.fit_refusal(bar.api, ns, gang, CHECK), 60, "the gang's Pending message"
    )
    assert message.startswith(
        f"needs 4 shares of 20Gi at once; the largest free share is 12Gi/100 on {node}"
    ), message
    assert not admitted(bar, ns, gang)
    assert job_pods(bar, ns, "gang") == [], "no pod of the gang exists before it is admitted"

    for index in (0, 1):
        core.delete_namespaced_pod(f"filler-{index}", ns, grace_period_seconds=0)
    poll_until(lambda: admitted(bar, ns, gang), 120, "the gang admitted once two GPUs are free")
    placed = wait_running(bar, ns, "gang", 4)
    assert len(placed) == 4 and set(placed) == {node}


def test_a_job_planned_on_one_node_is_held_to_that_node(
    bar: Bar, nodes: Callable[..., str], namespaces: Callable[[str], str]
) -> None:
    """The check's Ready state carries a hostname nodeSelector for the PodSet, Kueue puts it in the
    pods' template, and the scheduler places the pods where the check planned them."""
    made = {nodes(40, 40), nodes(40, 40)}
    queue_bed.create(bar.api, queue_bed.cluster_queue("held-cq", FLAVOR, quota(1000), checks=[CHECK]))
    ns = namespaces("held-cq")
    workload = submit(bar, ns, "pair", 2, 30, "batch")
    poll_until(lambda: admitted(bar, ns, workload), 60, "the Job admitted")
    state = next(
        s
        for s in queue_bed.read_workload(bar.api, ns, workload)["status"]["admissionChecks"]
        if s["name"] == CHECK
    )
    planned = next(node for node in made if node in state["message"])
    assert state["message"] == f"fits: 2 pods on {planned}", state
    assert state["podSetUpdates"] == [{"name": "main", "nodeSelector": {"kubernetes.io/hostname": planned}}]
    placed = wait_running(bar, ns, "pair", 2)
    assert placed == [planned, planned]
    for pod in job_pods(bar, ns, "pair"):
        assert pod.spec and pod.spec.node_selector == {"kubernetes.io/hostname": planned}
    finish(bar, ns, "pair")


def test_a_failed_pods_replacement_keeps_its_workloads_gpu_share(
    bar: Bar, nodes: Callable[..., str], namespaces: Callable[[str], str]
) -> None:
    """A Job's pod fails and the Job controller makes another; until that one is placed, its share
    stays reserved, so a second Job asking the same GPU waits instead of being admitted onto it."""
    nodes(80)
    queue_bed.create(bar.api, queue_bed.cluster_queue("retry-cq", FLAVOR, quota(1000), checks=[CHECK]))
    ns = namespaces("retry-cq")
    core, batch = client.CoreV1Api(bar.api), client.BatchV1Api(bar.api)
    gate = "test.tessera.dev/hold"
    job = queue_bed.gpu_job(
        "retried", "q", 1, 60 * GiB_MIB, priority="batch", backoff_limit=1, scheduling_gates=[gate]
    )
    batch.create_namespaced_job(ns, client.V1Job.model_validate(job))
    retried = str(queue_bed.workload_of_job(bar.api, ns, "retried")["metadata"]["name"])
    poll_until(lambda: admitted(bar, ns, retried), 60, "the first Job admitted")

    def release_gates() -> None:
        for pod in job_pods(bar, ns, "retried"):
            if pod.spec and pod.spec.scheduling_gates and pod.metadata and pod.metadata.name:
                # null, not []: an empty list merges into the gates and removes none
                core.patch_namespaced_pod(pod.metadata.name, ns, {"spec": {"schedulingGates": None}})

    poll_until(lambda: len(job_pods(bar, ns, "retried")) == 1, 60, "the first pod created")
    release_gates()
    (first_pod,) = [p.metadata.name for p in job_pods(bar, ns, "retried") if p.metadata and p.metadata.name]
    pod_state.wait_until_bound(core, ns, first_pod)
    report_exit(core, ns, first_pod, "work", 1)

    def replacement() -> str | None:
        for pod in job_pods(bar, ns, "retried"):
            if pod.metadata and pod.metadata.name != first_pod and pod.status:
                claims = pod.status.resource_claim_statuses or []
                return pod.metadata.name if claims else None
        return None

    held = poll_until(replacement, 60, "the Job's replacement pod, with its claim, held by its gate")
    poll_until(
        lambda: (
            not any(
                c.status and c.status.allocation
                for c in client.ResourceV1Api(bar.api).list_namespaced_resource_claim(ns).items
            )
        ),
        60,
        "the failed pod's claim released",
    )

    second = submit(bar, ns, "second", 1, 60, "production")
    message = poll_until(lambda: queue_bed.fit_refusal(bar.api, ns, second, CHECK), 60, "the second Job held")
    assert "needs 1 share of 60Gi" in message, message
    assert not admitted(bar, ns, second), "the GPU's 80Gi hold one 60Gi share: the replacement's"

    release_gates()
    assert pod_state.wait_until_bound(core, ns, held)


def test_no_admitted_pod_ever_waited_for_gpu_capacity(bar: Bar) -> None:
    """Runs last in this module: the watcher has seen every pod of the scenarios above."""
    with bar.watcher.lock:
        assert bar.watcher.seen, "the watcher saw the scenarios' pods"
        assert bar.watcher.unschedulable == {}
