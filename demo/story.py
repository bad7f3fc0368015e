"""What `make demo` shows, step by step, on real test-bed nodes with simulated GPUs. Every figure it
prints is read back from the system (ResourceClaims, Workloads, a CUDA program's own output, the
exporters on port 31995); the script only chooses what to ask for. run() returns those figures, so
the short CI form (tests/e2e/test_demo.py, `python -m demo --ci`) checks the same things the
output says.

The set-up is the test bed's own: the local control plane with Kueue (testbed/cluster.py,
testbed/kueue.py), real nodes (testbed/node.py) with simulated GPUs, and the Helm chart installed on
them from the locally built images (testbed/chart_bed.py), with the admission check and the
chart's example queues switched on through its queue values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tessera.kube import api_client, raw_json
from tessera.quantity import GiB, MiB, quantity_to_int
from testbed import chart_bed as charts
from testbed import queue_bed
from testbed.chart_bed import EXAMPLES, ChartBed
from testbed.node import NodeFactory
from testbed.pod_state import events, sections
from testbed.polling import poll_until
from testbed.product_images import product_images

NAMESPACE = "demo"
TEAM = "team-a"  # the chart's first example ClusterQueue serves this namespace
# The namespaces of the chart's example ClusterQueues, which must exist before the install.
TEAMS = ("team-a", "team-b")
RELEASE = "tessera"
RELEASE_NAMESPACE = "tessera-system"
NODES = 2
WAIT = 300.0
# The image name the examples use: on the test bed it holds sh, the tools and shim_probe.
IMAGE = "docker.io/library/busybox:1.37"
KEEP_RUNNING = 'trap "exit 0" TERM; while true; do sleep 5 & wait $!; done'
CUDA_ERRORS = {0: "CUDA_SUCCESS", 2: "CUDA_ERROR_OUT_OF_MEMORY"}
NEIGHBOUR = "tessera-demo-neighbour"
NEIGHBOUR_MIB, NEIGHBOUR_CORES = 4096, 30
GANG, GANG_PODS, GANG_MIB, GANG_CORES = "gang", 4, 75 * 1024, 20
GANG_HOLDS = 1 * GiB
DUTY_SECONDS = 8


@dataclass(frozen=True)
class Placement:
    """Where one pod's share landed, as its ResourceClaim says."""

    pod: str
    claim: str
    node: str
    device: str
    uuid: str
    memory: int
    cores: int


@dataclass
class Shown:
    """The figures the demo printed, each read from the system."""

    placements: dict[str, Placement] = field(default_factory=dict)
    # shim_probe's own results: the CUresult of each allocation, and what the process saw.
    refused: dict[str, int] = field(default_factory=dict)
    neighbour: dict[str, int] = field(default_factory=dict)
    compute_share: float = 0.0
    queue_message: str = ""
    gang_pods_before_admission: int = -1
    gang_admitted: bool = False
    gang: dict[str, Placement] = field(default_factory=dict)
    metrics: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)


def say(text: str) -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n==> {text}")


# -- the set-up ------------------------------------------------------------------------------------


def release_values() -> dict[str, Any]:
    """The test bed's values plus the queue parts: the admission check (from the webhook image, on
    the demo's nodes) and the example queues, the first of them for the TEAM namespace."""
    values = charts.chart_values()
    check = {"image": charts.local_image("webhook")}
    values["queue"] = {"admissionCheck": {"enabled": True, **check}, "examples": {"enabled": True}}
    return values


@contextlib.contextmanager
def demo_bed(work: Path) -> Iterator[ChartBed]:
    """The control plane with Kueue, NODES real nodes with simulated GPUs, and the chart installed
    with the admission check and the example queues; everything stopped afterwards."""
    step("Starting a local control plane (etcd, kube-apiserver, controller manager, scheduler) and Kueue")
    with queue_bed.kueue_cluster() as cluster:
        kube = api_client(cluster.admin_kubeconfig)
        factory = NodeFactory(cluster)
        try:
            step("Building (or reusing) the images: Tessera's driver and webhook, the workload image")
            images = [*product_images().values(), *charts.workload_images(work / "images")]
            step(
                f"Starting {NODES} nodes (containerd, kubelet), each with {charts.GPUS_PER_NODE} "
                f"simulated GPUs of {charts.GPU_MEMORY // GiB} GiB"
            )
            nodes = factory.start(NODES, extra_images=images)
            charts.prepare_nodes(cluster, kube, nodes)
            core = client.CoreV1Api(kube)
            for namespace in (NAMESPACE, *TEAMS):
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
                poll_until(
                    lambda n=namespace: core.read_namespaced_service_account("default", n),  # type: ignore[misc]
                    60,
                    f"the default ServiceAccount of {namespace}",
                )
            step(
                "helm install tessera charts/tessera"
                " (node daemons, webhook, exporter, admission check, queues)"
            )
            with charts.installed_release(
                cluster,
                kube,
                nodes,
                work / "helm",
                release_values(),
                release=RELEASE,
                namespace=RELEASE_NAMESPACE,
                uninstall=False,  # the whole cluster goes at the end
            ) as bed:
                charts.wait_rolled_out(bed)
                for component in ("kubeletplugin", "webhook", "admissioncheck"):
                    for pod in bed.pods(component):
                        say(f"    {pod['metadata']['name']:<48} on {pod['spec']['nodeName']}")
                yield bed
        finally:
            step("Stopping the nodes and the control plane")
            factory.stop_all()


# -- reading the system ----------------------------------------------------------------------------


def device_uuids(kube: client.ApiClient) -> dict[tuple[str, str], str]:
    """(pool, device name) -> the GPU's UUID, from the published ResourceSlices."""
    listed = raw_json(client.ResourceV1Api(kube).list_resource_slice(_preload_content=False))
    return {
        (item["spec"]["pool"]["name"], device["name"]): device["attributes"]["uuid"]["string"]
        for item in listed["items"]
        for device in item["spec"].get("devices") or []
    }


def placement(kube: client.ApiClient, pod: dict[str, Any]) -> Placement:
    """The share the pod's (one) claim was allocated, read from the ResourceClaim."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    [status] = pod["status"]["resourceClaimStatuses"]
    claim = raw_json(
        client.ResourceV1Api(kube).read_namespaced_resource_claim(
            status["resourceClaimName"], namespace, _preload_content=False
        )
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    capacity = {k: quantity_to_int(v) for k, v in result["consumedCapacity"].items()}
    return Placement(
        pod=name,
        claim=claim["metadata"]["name"],
        node=pod["spec"]["nodeName"],
        device=result["device"],
        uuid=device_uuids(kube)[(result["pool"], result["device"])],
        memory=capacity.get("memory", 0),
        cores=capacity.get("cores", 0),
    )


def running_pods(kube: client.ApiClient, namespace: str, selector: str, count: int) -> list[dict[str, Any]]:
    """The ``count`` pods of the selector once all are Running (a failed one raises with events)."""
    core = client.CoreV1Api(kube)

    def ready() -> list[dict[str, Any]] | None:
        pods = raw_json(core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))[
            "items"
        ]
        failed = [p["metadata"]["name"] for p in pods if p["status"].get("phase") in ("Failed", "Succeeded")]
        if failed:
            raise RuntimeError(f"{failed} ended:\n{events(kube, namespace)}")
        up = [p for p in pods if p["status"].get("phase") == "Running"]
        return up if len(up) == count == len(pods) else None

    try:
        found: list[dict[str, Any]] = poll_until(ready, WAIT, f"{count} pods running in {namespace}")
    except TimeoutError as error:
        raise RuntimeError(f"{error}\nevents:\n{events(kube, namespace)}") from error
    return found


def wait_running(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    core = client.CoreV1Api(kube)

    def running() -> dict[str, Any] | None:
        pod = raw_json(core.read_namespaced_pod(name, namespace, _preload_content=False))
        phase = pod["status"].get("phase")
        if phase in ("Failed", "Succeeded"):
            raise RuntimeError(f"{name} ended ({phase}):\n{events(kube, namespace)}")
        return pod if phase == "Running" else None

    try:
        found: dict[str, Any] = poll_until(running, WAIT, f"{namespace}/{name} running")
    except TimeoutError as error:
        raise RuntimeError(f"{error}\nevents:\n{events(kube, namespace)}") from error
    return found


def probe(bed: ChartBed, pod: str, script: str, timeout: float = 120) -> dict[str, dict[str, str]]:
    """Run a script of shim_probe calls in the pod's container; its sections."""
    out = bed.kubectl("exec", "-n", NAMESPACE, pod, "--", "sh", "-c", script, timeout=timeout)
    return sections(out)


def cuda(rc: str) -> str:
    return f"{CUDA_ERRORS.get(int(rc), 'CUresult')} ({rc})"


def mib(value: float) -> str:
    return f"{value / MiB:,.0f} MiB"


def show_placements(placements: Mapping[str, Placement]) -> None:
    """POD, NODE, the claim's DEVICE (its name in the node's ResourceSlice) and its share."""
    say(f"    {'POD':<28} {'NODE':<15} {'DEVICE':<44} {'MEMORY':>10} {'CORES':>5}")
    for p in placements.values():
        say(f"    {p.pod:<28} {p.node:<15} {p.device:<44} {mib(p.memory):>10} {p.cores:>4}%")


# -- the story -------------------------------------------------------------------------------------


def shares(bed: ChartBed, shown: Shown) -> None:
    step("Applying examples/hami-pod.yaml (HAMi limits) and examples/claim-template-pod.yaml (native DRA)")
    for example in ("hami-pod.yaml", "claim-template-pod.yaml"):
        say(f"    $ kubectl apply -n {NAMESPACE} -f examples/{example}")
        bed.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLES / example))
    hami, native = "tessera-example-hami", "tessera-example-claim"
    for name in (hami, native):
        shown.placements[name] = placement(bed.kube, wait_running(bed.kube, NAMESPACE, name))
    # A neighbour written for HAMi too, pinned to the HAMi pod's GPU by the HAMi annotation.
    uuid = shown.placements[hami].uuid
    neighbour = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": NEIGHBOUR, "annotations": {"nvidia.com/use-gpuuuid": uuid}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", KEEP_RUNNING],
                    "resources": {
                        "limits": {
                            "nvidia.com/gpumem": str(NEIGHBOUR_MIB),
                            "nvidia.com/gpucores": str(NEIGHBOUR_CORES),
                        }
                    },
                }
            ],
        },
    }
    say(
        f"    a neighbour pod, {NEIGHBOUR_MIB} MiB and {NEIGHBOUR_CORES}%,"
        f" pinned to {uuid} (nvidia.com/use-gpuuuid)"
    )
    client.CoreV1Api(bed.kube).create_namespaced_pod(NAMESPACE, client.V1Pod.model_validate(neighbour))
    shown.placements[NEIGHBOUR] = placement(bed.kube, wait_running(bed.kube, NAMESPACE, NEIGHBOUR))
    step("Where each share landed (read from the ResourceClaims and the ResourceSlices)")
    show_placements(shown.placements)


def memory_limit(bed: ChartBed, shown: Shown) -> None:
    hami = shown.placements["tessera-example-hami"]
    other = shown.placements[NEIGHBOUR]
    step(f"Memory limit: a CUDA program in {hami.pod} asks for more than its share")
    over = hami.memory + 64 * MiB
    seen = probe(
        bed, hami.pod, f"echo '== info'; shim_probe info; echo '== over'; shim_probe alloc mem {over}"
    )
    shown.refused = {"total": int(seen["info"]["total"]), "asked": over, "rc": int(seen["over"]["rc"])}
    say(
        f"    {hami.pod} sees {mib(shown.refused['total'])} of GPU memory; cuMemAlloc of {mib(over)}: "
        f"{cuda(seen['over']['rc'])}"
    )
    same = "the same GPU" if other.uuid == hami.uuid else f"GPU {other.uuid}"
    seen = probe(
        bed,
        other.pod,
        f"echo '== info'; shim_probe info; echo '== fits'; shim_probe alloc mem {other.memory}",
    )
    shown.neighbour = {
        "total": int(seen["info"]["total"]),
        "asked": other.memory,
        "rc": int(seen["fits"]["rc"]),
        "same_gpu": int(other.uuid == hami.uuid),
    }
    say(
        f"    its neighbour {other.pod} on {same} sees {mib(shown.neighbour['total'])}; cuMemAlloc of "
        f"its whole {mib(other.memory)}: {cuda(seen['fits']['rc'])}"
    )


def compute_cap(bed: ChartBed, shown: Shown) -> None:
    hami = shown.placements["tessera-example-hami"]
    step(f"Compute cap: {hami.pod} keeps its GPU busy for {DUTY_SECONDS} s under its {hami.cores}% share")
    seen = probe(
        bed,
        hami.pod,
        f"echo '== duty'; shim_probe duty 2000000 {DUTY_SECONDS} 4",
        timeout=DUTY_SECONDS + 120,
    )
    shown.compute_share = float(seen["duty"]["share"])
    say(
        f"    its kernels got {shown.compute_share:.1f}% of the GPU's time (shim_probe's own measure: "
        f"{seen['duty']['launched']} kernels of 2 ms in {int(seen['duty']['elapsed_ns']) / 1e9:.1f} s)"
    )


def queue(bed: ChartBed, shown: Shown) -> None:
    kube = bed.kube
    check = f"{RELEASE}-gpu-fit"
    step(f"Kueue: the chart's example queues, with the admission check {check}")
    poll_until(lambda: cluster_queue_active(kube, TEAM), WAIT, f"ClusterQueue {TEAM} Active")
    say(f"    ClusterQueue {TEAM} is Active; LocalQueue gpus in namespace {TEAM}")
    job = queue_bed.gpu_job(
        GANG,
        "gpus",
        GANG_PODS,
        GANG_MIB,
        GANG_CORES,
        image=IMAGE,
        command=[
            "sh",
            "-c",
            f'cat "$TESSERA_LIMITS_FILE"; sleep 3600 | shim_probe alloc mem {GANG_HOLDS} hold',
        ],
    )
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    say(
        f"    a Job of {GANG_PODS} pods that must run at once (a gang), each {GANG_MIB} MiB and "
        f"{GANG_CORES}% of a GPU"
    )
    client.BatchV1Api(kube).create_namespaced_job(TEAM, client.V1Job.model_validate(job))
    workload = queue_bed.workload_of_job(kube, TEAM, GANG)["metadata"]["name"]

    shown.queue_message = poll_until(
        lambda: queue_bed.fit_refusal(kube, TEAM, workload, check), WAIT, "the gang's Pending message"
    )
    core = client.CoreV1Api(kube)
    gang_selector = f"batch.kubernetes.io/job-name={GANG}"
    shown.gang_pods_before_admission = len(core.list_namespaced_pod(TEAM, label_selector=gang_selector).items)
    say(f"    Workload {workload} waits; the fit check says: {shown.queue_message}")
    say(f"    pods of the Job so far: {shown.gang_pods_before_admission}")
    say(f"    deleting {NEIGHBOUR} (its share frees room on {shown.placements[NEIGHBOUR].uuid})")
    core.delete_namespaced_pod(NEIGHBOUR, NAMESPACE, grace_period_seconds=0)
    del shown.placements[NEIGHBOUR]

    def admitted() -> bool:
        return queue_bed.has_condition(queue_bed.read_workload(kube, TEAM, workload), "Admitted")

    poll_until(admitted, WAIT, "the gang admitted")
    shown.gang_admitted = True
    state = queue_bed.check_state(queue_bed.read_workload(kube, TEAM, workload), check)
    say(f"    admitted: the check is {state.get('state')}: {state.get('message', '')}")
    pods = running_pods(kube, TEAM, gang_selector, GANG_PODS)
    shown.gang = {p["metadata"]["name"]: placement(kube, p) for p in pods}
    step("Where the gang's shares landed (read from the ResourceClaims)")
    show_placements(shown.gang)


def cluster_queue_active(kube: client.ApiClient, name: str) -> bool:
    body = raw_json(
        client.CustomObjectsApi(kube).get_cluster_custom_object(
            queue_bed.GROUP, queue_bed.VERSION, "clusterqueues", name, _preload_content=False
        )
    )
    return queue_bed.has_condition(body, "Active")


GPU_COLUMNS = (
    ("SHARES", "tessera_gpu_shares", lambda v: f"{v:.0f}"),
    ("ALLOCATED", "tessera_gpu_memory_allocated_bytes", mib),
    ("USED", "tessera_gpu_memory_used_bytes", mib),
    ("COMPUTE ALLOC", "tessera_gpu_compute_allocated_ratio", lambda v: f"{100 * v:.0f}%"),
)
CONTAINER_COLUMNS = (
    ("LIMIT", "tessera_container_gpu_memory_limit_bytes", mib),
    ("USED", "tessera_container_gpu_memory_used_bytes", mib),
    ("CAP", "tessera_container_gpu_compute_limit_ratio", lambda v: f"{100 * v:.0f}%"),
)


def metrics(bed: ChartBed, shown: Shown) -> None:
    step("Metrics scraped from port 31995 on each node")
    for node in bed.nodes:
        text = poll_until(lambda a=node.address: charts.scrape(a), 60, f"metrics on {node.address}")  # type: ignore[misc]
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("tessera_"):
                    shown.metrics.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    gpu_rows = {
        (labels["node"], labels["device_uuid"]) for labels, _ in shown.metrics.get("tessera_gpu_shares", [])
    }
    say(f"    {'NODE':<15} {'GPU UUID':<44}" + "".join(f" {c[0]:>13}" for c in GPU_COLUMNS))
    for node_name, uuid in sorted(gpu_rows):
        cells = [column(shown, name, fmt, node=node_name, device_uuid=uuid) for _, name, fmt in GPU_COLUMNS]
        say(f"    {node_name:<15} {uuid:<44}" + "".join(f" {c:>13}" for c in cells))
    rows = sorted(
        {
            (labels["namespace"], labels["pod"], labels["container"], labels["device_uuid"])
            for labels, _ in shown.metrics.get("tessera_container_gpu_memory_limit_bytes", [])
        }
    )
    say(f"\n    {'NAMESPACE/POD':<40} {'GPU UUID':<44}" + "".join(f" {c[0]:>11}" for c in CONTAINER_COLUMNS))
    for namespace, pod, container, uuid in rows:
        keys = {"namespace": namespace, "pod": pod, "container": container, "device_uuid": uuid}
        cells = [column(shown, name, fmt, **keys) for _, name, fmt in CONTAINER_COLUMNS]
        say(f"    {namespace + '/' + pod:<40} {uuid:<44}" + "".join(f" {c:>11}" for c in cells))


def metric(shown: Shown, name: str, **match: str) -> float | None:
    for labels, value in shown.metrics.get(name, []):
        if all(labels.get(k) == v for k, v in match.items()):
            return value
    return None


def column(shown: Shown, name: str, fmt: Callable[[float], str], **match: str) -> str:
    value = metric(shown, name, **match)
    return "-" if value is None else fmt(value)


def run(bed: ChartBed) -> Shown:
    """The story on an installed bed; what it showed."""
    shown = Shown()
    for part in (shares, memory_limit, compute_cap, queue, metrics):
        part(bed, shown)
    return shown


def claims(shown: Shown) -> list[tuple[str, bool]]:
    """Each thing the output claims, and whether the figures read back bear it out."""
    hami = shown.placements.get("tessera-example-hami")
    native = shown.placements.get("tessera-example-claim")
    gpu_uuids = {labels["device_uuid"] for labels, _ in shown.metrics.get("tessera_gpu_shares", [])}
    limits = {
        labels["pod"]: value
        for labels, value in shown.metrics.get("tessera_container_gpu_memory_limit_bytes", [])
    }
    used = {
        labels["pod"]: value
        for labels, value in shown.metrics.get("tessera_container_gpu_memory_used_bytes", [])
    }
    return [
        (
            "the HAMi pod got 2000 MiB and 25% of a GPU",
            hami is not None and (hami.memory, hami.cores) == (2000 * MiB, 25),
        ),
        (
            "the native claim got 2 GiB and 25% of a GPU",
            native is not None and (native.memory, native.cores) == (2 * GiB, 25),
        ),
        (
            "the neighbour shared the HAMi pod's GPU",
            shown.neighbour.get("same_gpu") == 1,
        ),
        (
            "the HAMi pod sees exactly its share",
            hami is not None and shown.refused.get("total") == hami.memory,
        ),
        ("past its limit it gets CUDA_ERROR_OUT_OF_MEMORY", shown.refused.get("rc") == 2),
        (
            "its neighbour allocates its whole share",
            shown.neighbour.get("rc") == 0 and shown.neighbour.get("total") == NEIGHBOUR_MIB * MiB,
        ),
        # The cap is an upper bound; a loaded machine may give the kernels less.
        ("the compute cap holds", hami is not None and 0 < shown.compute_share <= hami.cores * 1.2),
        (
            "the gang waited with the fit check's reason",
            f"needs {GANG_PODS} shares of" in shown.queue_message,
        ),
        ("no pod of the gang existed before admission", shown.gang_pods_before_admission == 0),
        ("the gang was admitted", shown.gang_admitted),
        (
            "all its pods ran at once, each with its share on its own GPU",
            len(shown.gang) == GANG_PODS
            and all((p.memory, p.cores) == (GANG_MIB * MiB, GANG_CORES) for p in shown.gang.values())
            and len({p.uuid for p in shown.gang.values()}) == GANG_PODS,
        ),
        ("every node's exporter shows its GPUs", len(gpu_uuids) == NODES * charts.GPUS_PER_NODE),
        (
            "the exporter shows each running share's memory limit",
            all(limits.get(p.pod) == p.memory for p in [*shown.placements.values(), *shown.gang.values()]),
        ),
        (
            "the gang's containers hold memory the exporter sees",
            all(used.get(p) == GANG_HOLDS for p in shown.gang),
        ),
    ]
