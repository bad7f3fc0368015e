"""Queue admission on the test bed: Kueue objects, GPU Jobs, fake GPU nodes, and the admission check
run as its own command, shared by the integration and end-to-end tests and the benchmark.

Kueue's objects are written as a user writes YAML (``kueue.x-k8s.io/v1beta2``); the GPU Jobs carry
HAMi resources in their template, as a user moving from HAMi writes them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from tessera.driver.devices import device
from tessera.driver.discovery import Gpu
from tessera.driver.slices import slice_object
from tessera.gpu_request import read_request, selection_for
from tessera.kube import api_client, raw_json
from tessera.names import DRIVER_NAME, GPU_REQUEST_ANNOTATION, HAMI_GPU, HAMI_GPUCORES, HAMI_GPUMEM
from tessera.quantity import GiB
from tessera.watching import watch_forever
from tessera.webhook.conversion import claim_template
from tessera.webhook.fleet import Fleet
from testbed.accounts import grant_in_namespace, service_account_token, token_kubeconfig
from testbed.cluster import LocalCluster
from testbed.fake_nodes import create_ready_node
from testbed.kueue import KueueOptions
from testbed.polling import poll_until
from testbed.process import ManagedProcess, free_port

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
CONTROLLER_NAME = "tessera.dev/gpu-fit"
GPU_MEMORY = "tessera.dev/gpu-memory"
GPU_CORES = "tessera.dev/gpu-cores"

KUEUE_RESOURCES: dict[str, Any] = {
    "transformations": [
        {
            "input": HAMI_GPUMEM,
            "multiplyBy": HAMI_GPU,
            "strategy": "Replace",
            "outputs": {GPU_MEMORY: "1Mi"},
        },
        {
            "input": HAMI_GPUCORES,
            "multiplyBy": HAMI_GPU,
            "strategy": "Replace",
            "outputs": {GPU_CORES: "1"},
        },
    ]
}
"""Kueue's ``resources`` configuration that docs/queue.md documents: a Job's gpumem (MiB per GPU) and
gpucores (percent per GPU) become quota resources in bytes and percent, multiplied by the pod's
nvidia.com/gpu, so a pod asking 2 GPUs of 20000 MiB is charged 40000Mi. The tests run Kueue with it."""

QUOTA_RESOURCES = (HAMI_GPU, GPU_MEMORY, GPU_CORES)
"""What a ClusterQueue covers under that configuration."""


# -- fake GPU nodes --------------------------------------------------------------------------------


def gpu_record(node: str, index: int, memory_gi: int, product: str) -> Gpu:
    """A GPU as discovery would report it; the UUID names its node and index."""
    return Gpu(
        index=index,
        uuid=f"GPU-{node}-{index}",
        product_name=product,
        brand="Nvidia",
        architecture="Ampere",
        memory_bytes=memory_gi * GiB,
        cuda_compute_capability=(8, 0),
        driver_version="550.54.15",
        cuda_driver_version=12040,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        minor_number=index,
        mig_enabled=False,
    )


def gpu_devices(
    node: str, memories_gi: Sequence[int], product: str = "NVIDIA A100-SXM4-80GB"
) -> list[dict[str, Any]]:
    """The driver's own Device objects for GPUs of these sizes."""
    return [device(gpu_record(node, i, m, product)) for i, m in enumerate(memories_gi)]


def publish_gpus(
    api: client.ApiClient,
    node: str,
    memories_gi: Sequence[int],
    generation: int = 1,
    product: str = "NVIDIA A100-SXM4-80GB",
) -> list[str]:
    """Create or replace ``node``'s slice with GPUs of these sizes (as the driver would); returns
    their UUIDs."""
    resource = client.ResourceV1Api(api)
    core = client.CoreV1Api(api)
    devices = gpu_devices(node, memories_gi, product)
    uid = str(raw_json(core.read_node(node, _preload_content=False))["metadata"]["uid"])
    body = slice_object(node, uid, DRIVER_NAME, devices, generation)
    try:
        resource.create_resource_slice(client.V1ResourceSlice.model_validate(body))
    except ApiException as error:
        if error.status != 409:
            raise
        current = raw_json(resource.read_resource_slice(body["metadata"]["name"], _preload_content=False))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        body["spec"]["pool"]["generation"] = current["spec"]["pool"]["generation"] + 1
        resource.replace_resource_slice(body["metadata"]["name"], client.V1ResourceSlice.model_validate(body))
    return [d["attributes"]["uuid"]["string"] for d in devices]


def gpu_node(api: client.ApiClient, name: str, memories_gi: Sequence[int], **kwargs: Any) -> list[str]:
    """A Ready node without a kubelet that publishes GPUs of these sizes; returns their UUIDs."""
    create_ready_node(api, name)
    return publish_gpus(api, name, memories_gi, **kwargs)


# -- Kueue objects ---------------------------------------------------------------------------------


def kueue_object(
    kind: str, name: str, spec: Mapping[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": metadata, "spec": dict(spec)}


_PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "AdmissionCheck": "admissionchecks",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "Cohort": "cohorts",
}


def create(api: client.ApiClient, body: Mapping[str, Any]) -> None:
    """Create a Kueue object (cluster-scoped or namespaced, by whether it names a namespace)."""
    custom = client.CustomObjectsApi(api)
    plural = _PLURALS[body["kind"]]
    namespace = body["metadata"].get("namespace")
    if namespace:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, dict(body))
    else:
        custom.create_cluster_custom_object(GROUP, VERSION, plural, dict(body))


def admission_check(name: str) -> dict[str, Any]:
    return kueue_object("AdmissionCheck", name, {"controllerName": CONTROLLER_NAME})


def priority_class(name: str, value: int) -> dict[str, Any]:
    body = kueue_object("WorkloadPriorityClass", name, {})
    del body["spec"]
    body["value"] = value
    return body


def cluster_queue(
    name: str,
    flavor: str,
    quota: Mapping[str, str],
    *,
    checks: Sequence[str] = (),
    cohort: str | None = None,
    borrowing_limit: Mapping[str, str] | None = None,
    preemption: Mapping[str, Any] | None = None,
    strategy: str = "BestEffortFIFO",
) -> dict[str, Any]:
    """A ClusterQueue covering the HAMi resources with ``quota`` (nominal) in one flavor."""
    resources = []
    for resource, nominal in quota.items():
        entry: dict[str, Any] = {"name": resource, "nominalQuota": nominal}
        if borrowing_limit and resource in borrowing_limit:
            entry["borrowingLimit"] = borrowing_limit[resource]
        resources.append(entry)
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": strategy,
        "resourceGroups": [
            {"coveredResources": list(quota), "flavors": [{"name": flavor, "resources": resources}]}
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = dict(preemption)
    return kueue_object("ClusterQueue", name, spec)


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return kueue_object("LocalQueue", name, {"clusterQueue": cluster_queue_name}, namespace)


def gpu_job(
    name: str,
    queue: str,
    pods: int,
    gpumem_mib: int | None,
    gpucores: int | None = None,
    *,
    gpus: int = 1,
    priority: str | None = None,
    annotations: Mapping[str, str] | None = None,
    image: str = "tessera.local/none",
    command: Sequence[str] = (),
    node_selector: Mapping[str, str] | None = None,
    backoff_limit: int = 0,
    scheduling_gates: Sequence[str] = (),
) -> dict[str, Any]:
    """A batch/v1 Job of ``pods`` parallel pods, each asking HAMi resources (None leaves one out,
    and gpumem_mib=None with gpus=0 asks no GPU at all); ``backoff_limit`` failed pods are
    replaced, and every pod starts held by ``scheduling_gates``."""
    limits: dict[str, str] = {}
    if gpus:
        limits[HAMI_GPU] = str(gpus)
        if gpumem_mib is not None:
            limits[HAMI_GPUMEM] = str(gpumem_mib)
        if gpucores is not None:
            limits[HAMI_GPUCORES] = str(gpucores)
    labels = {QUEUE_LABEL: queue}
    if priority:
        labels[PRIORITY_LABEL] = priority
    container: dict[str, Any] = {"name": "work", "image": image, "resources": {"limits": limits}}
    if command:
        container["command"] = list(command)
    if image.startswith("tessera.local/"):
        container["imagePullPolicy"] = "Never"  # built and imported by the test bed, never pulled
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if scheduling_gates:
        pod_spec["schedulingGates"] = [{"name": gate} for gate in scheduling_gates]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": backoff_limit,
            "template": {"metadata": {"annotations": dict(annotations or {})}, "spec": pod_spec},
        },
    }


def plain_gpu_pod_objects(
    namespace: str,
    name: str,
    queue: str | None,
    limits: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    memory_sizes_gi: Sequence[int] = (80,),
    record: str | None = None,
    extra_selector: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ResourceClaimTemplate, Pod) as JSON, for a plain pod as the webhook leaves it: the HAMi
    ``limits`` converted by the webhook's own code into a template and a claim reference, the pod in
    ``queue`` when one is named. With ``record``, the template's gpu-request annotation says that
    instead, and with ``extra_selector`` its request has that CEL selector too: a tenant's
    forgeries, since a tenant may write templates in its own namespace."""
    container = {"name": "work", "image": "tessera.local/none", "resources": {"limits": dict(limits)}}
    request = read_request('container "work"', container, selection_for(annotations or {}))
    assert request is not None
    fleet = Fleet(tuple(m * GiB for m in memory_sizes_gi), 8)
    template = claim_template(namespace, 'container "work"', request, fleet)
    if record is not None:
        template["spec"]["metadata"]["annotations"][GPU_REQUEST_ANNOTATION] = record
    if extra_selector is not None:
        body = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        body.setdefault("selectors", []).append({"cel": {"expression": extra_selector}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {QUEUE_LABEL: queue} if queue else {},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}],
            "containers": [
                {"name": "work", "image": "tessera.local/none", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    return template, pod


def plain_gpu_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    queue: str | None,
    limits: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    memory_sizes_gi: Sequence[int] = (80,),
    record: str | None = None,
    extra_selector: str | None = None,
) -> None:
    """Create the template and the pod of :func:`plain_gpu_pod_objects` (same arguments)."""
    template, pod = plain_gpu_pod_objects(
        namespace, name, queue, limits, annotations, memory_sizes_gi, record, extra_selector
    )
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(
        namespace, client.V1ResourceClaimTemplate.model_validate(template)
    )
    client.CoreV1Api(api).create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))


def published_uuids(api: client.ApiClient, node: str) -> list[str]:
    """The UUIDs of the GPUs the driver publishes for ``node``, in device index order."""
    listed = raw_json(
        client.ResourceV1Api(api).list_resource_slice(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
    )
    devices = [d for item in listed["items"] for d in item["spec"].get("devices") or []]
    devices.sort(key=lambda d: d["attributes"].get("index", {}).get("int", 0))
    return [d["attributes"]["uuid"]["string"] for d in devices]


# -- reading Workloads -----------------------------------------------------------------------------


def workloads(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    custom = client.CustomObjectsApi(api)
    listed = raw_json(
        custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", _preload_content=False)
    )
    items: list[dict[str, Any]] = listed.get("items") or []
    return items


def workload_of_job(
    api: client.ApiClient, namespace: str, job: str, timeout: float = 60, kind: str = "Job"
) -> dict[str, Any]:
    """The Workload Kueue made for ``job`` (its owner reference names the Job, or the Pod)."""

    def find() -> dict[str, Any] | None:
        for item in workloads(api, namespace):
            owners = item["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == kind and o.get("name") == job for o in owners):
                return item
        return None

    found: dict[str, Any] = poll_until(find, timeout, f"the Workload of {kind} {namespace}/{job}")
    return found


def after_creation_second(api: client.ApiClient, namespace: str, workload: str) -> None:
    """Return once the clock is past the second in which ``workload`` was created. Kueue orders
    equal priorities by creation time, which the API server records to the second: a test that
    checks first-in-first-out must not create two Workloads in one second."""
    created = read_workload(api, namespace, workload)["metadata"]["creationTimestamp"]
    second = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    poll_until(lambda: datetime.now(UTC) >= second + timedelta(seconds=1), 5, f"the second after {created}")


def read_workload(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    return raw_json(
        custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "workloads", name, _preload_content=False
        )
    )


def check_state(workload: Mapping[str, Any], check: str) -> dict[str, Any]:
    for state in (workload.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            return dict(state)
    return {}


def fit_refusal(api: client.ApiClient, namespace: str, workload: str, check: str) -> str | None:
    """The check's message while it holds the Workload Pending because its shares do not fit
    ("needs ..."), else None: what a test polls for to see the refusal a user would read."""
    state = check_state(read_workload(api, namespace, workload), check)
    message = str(state.get("message", ""))
    return message if state.get("state") == "Pending" and "needs" in message else None


def has_condition(workload: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def http_status(port: int, path: str) -> int:
    """The status of a plain-HTTP GET on 127.0.0.1 (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


# -- the admission check as a command --------------------------------------------------------------


RULES_FILE = Path(__file__).resolve().parents[1] / "charts/tessera/files/admissioncheck-rules.yaml"
ACCOUNT = "tessera-admission-check"
NAMESPACE = "tessera"
"""The check's namespace on the test bed: its service account's, and its Lease's."""


def lease_rules(lease: str) -> list[dict[str, Any]]:
    """The chart's Role for the check's leader election (templates/rbac-admissioncheck.yaml; a chart
    test holds the two equal): create any Lease, read and renew only ``lease``."""
    group, resources = ["coordination.k8s.io"], ["leases"]
    return [
        {"apiGroups": group, "resources": resources, "verbs": ["create"]},
        {"apiGroups": group, "resources": resources, "resourceNames": [lease], "verbs": ["get", "update"]},
    ]


def admission_check_kubeconfig(cluster: LocalCluster) -> Path:
    """A kubeconfig holding exactly the chart's RBAC for the check (its service account in the
    ``tessera`` namespace): the ClusterRole's rules, and the Role for its Lease (named as the check's
    default --leader-election-id), as the check's pod would have."""
    api = api_client(cluster.admin_kubeconfig)
    try:
        rules = yaml.safe_load(RULES_FILE.read_text())
        token = service_account_token(api, NAMESPACE, ACCOUNT, rules, expiration_seconds=86400)
        grant_in_namespace(api, NAMESPACE, ACCOUNT, f"{ACCOUNT}-leader-election", lease_rules(ACCOUNT))
    finally:
        api.close()  # type: ignore[no-untyped-call]
    return token_kubeconfig(cluster, token, ACCOUNT, cluster.state_dir / "admission-check.kubeconfig")


def admission_check_process(
    cluster: LocalCluster, *extra: str, name: str = "tessera-admission-check"
) -> tuple[ManagedProcess, int]:
    """``tessera-admission-check`` against the cluster under the chart's RBAC, electing its leader on
    a Lease in the ``tessera`` namespace, logging into the cluster's log folder; the cluster stops it
    with its own processes (``name`` names the process and its log, one per replica). Returns the
    process and its health port."""
    port = free_port()
    argv: list[str | Path] = [
        sys.executable,
        "-m",
        "tessera.admissioncheck.cli",
        f"--kubeconfig={admission_check_kubeconfig(cluster)}",
        "--bind-address=127.0.0.1",
        f"--health-port={port}",
        "--probe-port=-1",  # replicas share the loopback address; the callers probe the health port
        f"--leader-election-namespace={NAMESPACE}",
        "--log-level=debug",
        *extra,
    ]
    process = ManagedProcess(name, argv, cluster.log_dir, env=dict(os.environ))
    cluster.processes.append(process)
    return process, port


def kueue_cluster() -> LocalCluster:
    """A local control plane (not started) with Kueue charging GPU memory and cores through
    ``KUEUE_RESOURCES``: the configuration the queue tests, the demo and the benchmarks run Kueue
    with. Starting it builds what is missing (tests check first: a build outlasts a test)."""
    return LocalCluster(kueue=KueueOptions(extra_config={"resources": KUEUE_RESOURCES}))


def ready_admission_check(
    cluster: LocalCluster, *check_args: str, name: str = "tessera-admission-check"
) -> tuple[ManagedProcess, int]:
    """:func:`admission_check_process` with ``check_args`` added to its flags, once its caches
    have synced: the process and its health port."""
    process, port = admission_check_process(cluster, *check_args, name=name)
    process.wait_until(lambda: http_status(port, "/readyz") == 200, 120, "caches synced")
    return process, port


@contextlib.contextmanager
def checked_kueue_cluster(
    *check_args: str,
) -> Iterator[tuple[LocalCluster, client.ApiClient, ManagedProcess, int]]:
    """A :func:`kueue_cluster` of its own, running, with a :func:`ready_admission_check`: the
    cluster, an admin client, the check's process and its health port."""
    with kueue_cluster() as cluster:
        api = api_client(cluster.admin_kubeconfig)
        process, port = ready_admission_check(cluster, *check_args)
        yield cluster, api, process, port


class CheckHistory:
    """Every distinct entry of one admission check on each Workload of a namespace, as a watch delivers them,
    so a Workload set Ready twice (two deciders, two messages or transition times) shows up."""

    def __init__(self, api: client.ApiClient, namespace: str, check: str) -> None:
        self._check = check
        self.entries: dict[str, list[tuple[str, str, str]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        custom = client.CustomObjectsApi(api)
        list_call = functools.partial(
            custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "workloads"
        )
        self._thread = threading.Thread(
            target=watch_forever, args=(list_call, self._seen, self._stop, "workloads"), daemon=True
        )
        self._thread.start()

    def _seen(self, kind: str, obj: Mapping[str, Any]) -> None:
        for workload in obj["items"] if kind == "SYNCED" else [obj]:
            state = check_state(workload, self._check)
            if not state:
                continue
            entry = (state.get("state", ""), state.get("message", ""), state.get("lastTransitionTime", ""))
            with self._lock:
                seen = self.entries.setdefault(workload["metadata"]["name"], [])
                if not seen or seen[-1] != entry:
                    seen.append(entry)

    def first(self, workload: str, state: str, saying: str = "") -> tuple[str, str, str] | None:
        """The first entry of ``workload`` in ``state`` (state, message, transition time) whose
        message contains ``saying``, if any: a state Kueue resets within a moment (Rejected becomes
        Pending as it deactivates the Workload) is still seen here, where a poll of the object could
        miss it."""
        with self._lock:
            return next((e for e in self.entries.get(workload, []) if e[0] == state and saying in e[1]), None)

    def readies(self, workload: str) -> int:
        with self._lock:
            return sum(1 for state, _, _ in self.entries.get(workload, []) if state == "Ready")

    def stop(self) -> None:
        """Stop recording. Returns at once: the watch in flight ends at its server-side timeout (up
        to 30 s) and its daemon thread with it; waiting for that cost every test that used this
        about 28 s."""
        self._stop.set()
