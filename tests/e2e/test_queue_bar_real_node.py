"""The queue bar on a real node: real Kueue v0.17, the real scheduler, kubelet and containerd, the
node daemon over four simulated 48 GiB GPUs, the webhook and the admission check. Containers really
run; a Job ends when its pods are told to (a file made with kubectl exec), as work ends.

- Gang: pods outside the queue take 36 GiB of each GPU (pinned by UUID), so each has 12 GiB free. A
  Job of 4 pods of 20 GiB is not admitted and its Workload says why; when two of those pods end, it
  is admitted, and all four of its pods run at once on the two freed GPUs. None of its pods exists
  before admission.
- Quota: Jobs beyond a team's GPU memory quota wait and are admitted as others finish, in priority
  then FIFO order.
- Borrowing and reclaim: a team borrows idle quota; when the lender submits, the borrower's Job is
  preempted (its pod really stopped) and the lender's runs on the GPU share it gave back.
- A hostile tenant's admitted Jobs whose pods are not placed (a label no node has, a hostname that
  does not exist, a scheduling gate) keep the room they were admitted for, as running pods would,
  but keep a neighbour off the rest of their node only for the check's arrival window.
- Throughout, a watcher sees every pod: none but the hostile tenant's is ever left unschedulable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.admissioncheck.controller import ARRIVAL_WINDOW_SECONDS
from tessera.admissioncheck.pinning import pins_from_state
from tessera.kube import api_client, raw_json
from tessera.quantity import GiB
from tessera.watching import watch_forever
from testbed import queue_bed
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.kubectl import kubectl
from testbed.names import unique_name
from testbed.node import NodeFactory, RealNode
from testbed.polling import poll_until
from tests.e2e.test_driver_node import PROBE_IMAGE, probe_image
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]

CHECK = "gpu-fit"
NAMESPACE = "gang-team"
SLEEP = ["/bin/sh", "-c", "sleep 3600"]
# Runs until told to finish: kubectl exec <pod> -- /bin/sh -c ": > /tmp/done".
UNTIL_DONE = ["/bin/sh", "-c", "while [ ! -e /tmp/done ]; do sleep 0.2; done"]


@dataclass
class GangBed:
    cluster: LocalCluster
    api: client.ApiClient
    node: RealNode
    unschedulable: dict[str, str]
    running_together: list[set[str]]
    # Namespaces whose pods are made never to be placed: their pods are meant to be unschedulable.
    hostile_namespaces: set[str] = field(default_factory=set)

    def log_tails(self) -> dict[str, str]:
        return {**self.cluster.log_tails(60), **self.node.log_tails()}


@pytest.fixture(scope="module")
def bed(probe_image: Path, kueue_cluster: LocalCluster) -> Iterator[GangBed]:
    if os.geteuid() != 0:
        pytest.skip("real nodes need root: containerd and the kubelet mount, and manage cgroups and links")
    api = api_client(kueue_cluster.admin_kubeconfig)
    ensure_device_class(api)
    factory = NodeFactory(kueue_cluster)
    driver: DriverNode | None = None
    unschedulable: dict[str, str] = {}
    together: list[set[str]] = []
    stop = threading.Event()
    webhook: RunningWebhook | None = None
    try:
        [node] = factory.start(1, extra_images=[probe_image])
        driver = DriverNode(
            kueue_cluster,
            node.name,
            kubelet_root=node.paths.kubelet_root,
            cdi_dir=node.paths.cdi_dir,
            gpus=4,
            memory_bytes=48 * GiB,
        )
        driver.start()
        driver.wait_ready()
        webhook = RunningWebhook(api, kueue_cluster)
        queue_bed.ready_admission_check(kueue_cluster)
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
                name = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
                for condition in (pod.get("status") or {}).get("conditions") or []:
                    if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                        unschedulable[name] = condition.get("message", "")
                labels = pod["metadata"].get("labels", {})
                if (
                    pod["metadata"].get("namespace") == NAMESPACE
                    and labels.get("batch.kubernetes.io/job-name") == "gang"
                ):
                    running[name] = kind != "DELETED" and (pod.get("status") or {}).get("phase") == "Running"
                    together.append({n for n, up in running.items() if up})

        threading.Thread(
            target=watch_forever,
            args=(core.list_pod_for_all_namespaces, on_pod, stop, "pods"),
            daemon=True,
        ).start()
        yield GangBed(kueue_cluster, api, node, unschedulable, together)
    finally:
        stop.set()
        if webhook is not None:
            webhook.stop()
        if driver is not None:
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


@pytest.fixture(autouse=True)
def no_pod_left_unschedulable(bed: GangBed) -> Iterator[None]:
    """After each test, whatever ran before it: the watcher has seen no pod left unschedulable but
    the hostile tenant's, which it made unplaceable on purpose."""
    yield
    seen = {
        name: message
        for name, message in bed.unschedulable.items()
        if name.split("/", 1)[0] not in bed.hostile_namespaces
    }
    assert seen == {}, seen


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

    message = poll_until(
        lambda: queue_bed.fit_refusal(api, NAMESPACE, workload, CHECK), 90, "the gang's Pending message"
    )
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


# -- quota and borrowing ---------------------------------------------------------------------------


@pytest.fixture
def team(bed: GangBed) -> Iterator[Any]:
    """Namespaces with a LocalQueue ``q`` on a given ClusterQueue; their Jobs go at the end."""
    made: list[str] = []
    core = client.CoreV1Api(bed.api)

    def make(cluster_queue: str) -> str:
        name = unique_name("team")
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        poll_until(lambda: core.read_namespaced_service_account("default", name), 60, "default SA")
        queue_bed.create(bed.api, queue_bed.local_queue("q", name, cluster_queue))
        made.append(name)
        return name

    yield make
    batch = client.BatchV1Api(bed.api)
    for name in made:
        for job in batch.list_namespaced_job(name).items:
            if job.metadata and job.metadata.name:
                batch.delete_namespaced_job(job.metadata.name, name, propagation_policy="Foreground")


def quota(memory_gi: int) -> dict[str, str]:
    return {"nvidia.com/gpu": "100", queue_bed.GPU_MEMORY: f"{memory_gi}Gi", queue_bed.GPU_CORES: "10000"}


def submit(
    bed: GangBed,
    namespace: str,
    name: str,
    memory_gi: int,
    priority: str | None,
    pin: list[str],
    **template: Any,
) -> str:
    """Submit a Job of one pod of ``memory_gi`` on the GPUs ``pin`` names (``template``: more of
    gpu_job's keywords, such as a node_selector); returns its Workload."""
    job = queue_bed.gpu_job(
        name,
        "q",
        1,
        memory_gi * 1024,
        priority=priority,
        image=PROBE_IMAGE,
        command=UNTIL_DONE,
        annotations={"nvidia.com/use-gpuuuid": ",".join(pin)},
        **template,
    )
    client.BatchV1Api(bed.api).create_namespaced_job(namespace, client.V1Job.model_validate(job))
    return str(queue_bed.workload_of_job(bed.api, namespace, name)["metadata"]["name"])


def admitted(bed: GangBed, namespace: str, workload: str) -> bool:
    return queue_bed.has_condition(queue_bed.read_workload(bed.api, namespace, workload), "Admitted")


def running_pod(bed: GangBed, namespace: str, job: str, timeout: float = 180) -> str:
    core = client.CoreV1Api(bed.api)

    def find() -> str | None:
        for pod in core.list_namespaced_pod(
            namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
        ).items:
            if pod.status and pod.status.phase == "Running" and pod.metadata and pod.metadata.name:
                return pod.metadata.name
        return None

    name: str = poll_until(find, timeout, f"a running pod of {namespace}/{job}")
    return name


def finish(bed: GangBed, namespace: str, job: str) -> None:
    """Tell the Job's running pod to end, as its work would."""
    pod = running_pod(bed, namespace, job)
    kubectl(
        bed.cluster.admin_kubeconfig, "exec", "-n", namespace, pod, "--", "/bin/sh", "-c", ": > /tmp/done"
    )


def pending_in(bed: GangBed, cluster_queue: str) -> int:
    body = raw_json(
        client.CustomObjectsApi(bed.api).get_cluster_custom_object(
            queue_bed.GROUP, queue_bed.VERSION, "clusterqueues", cluster_queue, _preload_content=False
        )
    )
    return int((body.get("status") or {}).get("pendingWorkloads") or 0)


@pytest.fixture(scope="module")
def priorities(bed: GangBed) -> None:
    for name, value in (("production", 1000), ("interactive", 500), ("batch", 100)):
        queue_bed.create(bed.api, queue_bed.priority_class(name, value))


@pytest.fixture
def free_gpus(bed: GangBed) -> list[str]:
    """The GPUs' UUIDs, once nothing from the gang test holds them."""
    core = client.CoreV1Api(bed.api)
    client.BatchV1Api(bed.api).delete_collection_namespaced_job(NAMESPACE, propagation_policy="Background")
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    poll_until(lambda: not core.list_namespaced_pod(NAMESPACE).items, 120, "the gang test's pods gone")
    return queue_bed.published_uuids(bed.api, bed.node.name)


def test_jobs_beyond_the_quota_are_admitted_as_others_finish_in_priority_then_fifo_order(
    bed: GangBed, team: Any, priorities: None, free_gpus: list[str]
) -> None:
    queue_bed.create(
        bed.api,
        queue_bed.cluster_queue(
            "quota-cq",
            "gpus",
            quota(40),
            checks=[CHECK],
            strategy="StrictFIFO",
            preemption={"withinClusterQueue": "Never"},
        ),
    )
    ns = team("quota-cq")
    workloads = {job: submit(bed, ns, job, 20, "batch", free_gpus) for job in ("a", "b")}
    for job in ("a", "b"):
        running_pod(bed, ns, job)
    for job, priority in (("c", "batch"), ("d", "interactive"), ("e", "batch")):
        workloads[job] = submit(bed, ns, job, 20, priority, free_gpus)
        queue_bed.after_creation_second(bed.api, ns, workloads[job])  # FIFO needs distinct seconds
    poll_until(lambda: pending_in(bed, "quota-cq") == 3, 60, "c, d and e waiting for quota")

    def admitted_set() -> set[str]:
        return {job for job, workload in workloads.items() if admitted(bed, ns, workload)}

    order = []
    for done in ("a", "b", "d"):
        before = admitted_set()
        finish(bed, ns, done)

        def newly(before: set[str] = before) -> set[str]:
            return admitted_set() - before

        new = poll_until(newly, 180, f"an admission after {done} finished")
        assert len(new) == 1, new
        (job,) = new
        order.append(job)
        running_pod(bed, ns, job)
    assert order == ["d", "c", "e"], "priority first (interactive d), then FIFO among batch (c before e)"


def test_the_lender_reclaims_its_quota_by_preempting_the_borrower(
    bed: GangBed, team: Any, priorities: None, free_gpus: list[str]
) -> None:
    preemption = {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
    for cq in ("lender-cq", "borrower-cq"):
        queue_bed.create(
            bed.api,
            queue_bed.cluster_queue(
                cq, "gpus", quota(40), checks=[CHECK], cohort="pool", preemption=preemption
            ),
        )
    lender, borrower = team("lender-cq"), team("borrower-cq")
    two_gpus = free_gpus[:2]  # 2 x 48 GiB: room for exactly two 40 GiB Jobs
    # The borrower's own Job outranks its borrowing one, so Kueue's choice of victim is by priority
    # (between equal priorities it goes by admission time, which Kueue records to the second).
    own = submit(bed, borrower, "own", 40, "interactive", two_gpus)
    running_pod(bed, borrower, "own")
    borrowed = submit(bed, borrower, "borrowed", 40, "batch", two_gpus)
    borrowed_pod = running_pod(bed, borrower, "borrowed")

    reclaim = submit(bed, lender, "reclaim", 40, "production", two_gpus)
    poll_until(lambda: admitted(bed, lender, reclaim), 180, "the lender's Job admitted")
    running_pod(bed, lender, "reclaim")
    preempted = queue_bed.read_workload(bed.api, borrower, borrowed)
    assert not queue_bed.has_condition(preempted, "Admitted")
    assert any(
        c.get("type") in ("Preempted", "Evicted") and c.get("status") == "True"
        for c in preempted["status"].get("conditions", [])
    )
    names = {
        p.metadata.name for p in client.CoreV1Api(bed.api).list_namespaced_pod(borrower).items if p.metadata
    }
    assert borrowed_pod not in names, "the preempted Job's pod was stopped"
    assert admitted(bed, borrower, own)


# -- a hostile tenant ------------------------------------------------------------------------------


def test_pods_a_tenant_keeps_from_being_placed_hold_their_share_but_not_their_node(
    bed: GangBed, team: Any, free_gpus: list[str]
) -> None:
    """The check plans an admitted Workload's pods onto GPUs before they exist, keeps that room for
    them, and while they may be arriving admits nothing else onto their node (the scheduler could
    put it where they were planned). A tenant controls its Jobs' templates, so it can make pods
    that are never placed. Whatever the trick, its Workloads keep only the shares they were
    admitted for (as running pods would, and out of its own quota: given away, a pod let through
    later would wait for room it was promised), and the rest of the node goes to a neighbour once
    the arrival window ends. A template that already names a hostname is not held to another."""
    for cq in ("squat-cq", "neighbour-cq"):
        queue_bed.create(bed.api, queue_bed.cluster_queue(cq, "gpus", quota(1000), checks=[CHECK]))
    hostile, neighbour = team("squat-cq"), team("neighbour-cq")
    bed.hostile_namespaces.add(hostile)
    # Three pods of 40 GiB, each planned on a 48 GiB GPU of its own; the fourth GPU stays free.
    tricks: dict[str, dict[str, Any]] = {
        "no-such-label": {"node_selector": {"tessera.test/nowhere": "1"}},
        "no-such-host": {"node_selector": {"kubernetes.io/hostname": "nowhere"}},
        "gated": {"scheduling_gates": ["tessera.test/hold"]},
    }
    squats = {name: submit(bed, hostile, name, 40, None, free_gpus, **how) for name, how in tricks.items()}
    history = queue_bed.CheckHistory(bed.api, neighbour, CHECK)
    try:
        for name, workload in squats.items():
            poll_until(lambda w=workload: admitted(bed, hostile, w), 120, f"{name} admitted")  # type: ignore[misc]
        first = submit(bed, neighbour, "first", 40, None, free_gpus)
        poll_until(
            lambda: admitted(bed, neighbour, first),
            ARRIVAL_WINDOW_SECONDS + 120,
            "the neighbour admitted onto the free GPU once the squatters' arrival windows ended",
        )
        waited = history.first(first, "Pending", "once the pods already admitted there are placed")
    finally:
        history.stop()
    assert waited is not None, "the neighbour waited while the squatters' pods could be arriving"
    running_pod(bed, neighbour, "first")

    pins = {
        name: pins_from_state(queue_bed.check_state(queue_bed.read_workload(bed.api, hostile, w), CHECK))
        for name, w in squats.items()
    }
    assert pins["no-such-label"] == {"main": bed.node.name}, pins
    assert pins["no-such-host"] == {}, "a template that names a hostname is left as it is"

    # The squatters' shares are still theirs: a second neighbour is told there is no room ...
    second = submit(bed, neighbour, "second", 40, None, free_gpus)
    message = poll_until(
        lambda: queue_bed.fit_refusal(bed.api, neighbour, second, CHECK), 60, "the second neighbour refused"
    )
    assert "needs 1 share of 40Gi" in message and "the largest free share is 8Gi" in message, message
    # ... and the pod its tenant lets through at last finds the room it was admitted for.
    core = client.CoreV1Api(bed.api)
    [gated] = core.list_namespaced_pod(hostile, label_selector="batch.kubernetes.io/job-name=gated").items
    assert gated.metadata is not None and gated.metadata.name
    core.patch_namespaced_pod(gated.metadata.name, hostile, {"spec": {"schedulingGates": None}})
    running_pod(bed, hostile, "gated")
    unplaced = [
        p.metadata.name
        for p in core.list_namespaced_pod(hostile).items
        if p.metadata and p.spec and not p.spec.node_name
    ]
    assert len(unplaced) == 2, f"the other two squatters' pods are never placed: {unplaced}"
    assert not [name for name in bed.unschedulable if name.startswith(f"{neighbour}/")], bed.unschedulable
