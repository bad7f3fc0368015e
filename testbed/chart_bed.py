"""The chart on real nodes: `helm install` of charts/tessera runs the node daemon (DaemonSet), the
webhook (Deployment) and, with the queue values, the admission check as pods from the locally built
images (testbed/product_images.py, the same images images/Dockerfile builds) on test-bed nodes with
simulated GPUs. The chart's end-to-end tests (tests/e2e/test_chart_node.py) and the demo
(demo/story.py) both install through here.

What the test bed sets through values, and why: each node's kubelet root, CDI folder and claim
state live in its own folder (hostPaths.nodeRoot plus $(NODE_NAME)); the simulated driver's
libraries and configuration stand where NVIDIA's would (driverSource own, driverLibraryDir,
SIMGPU_CONFIG); the webhook tells a waiting pod why after 5 s, not 60, so tests need not wait
long for that Event; the daemon runs in the host network, bound to its node's address, because the test
bed has neither kube-proxy (NodePort) nor the CNI portmap plugin (hostPort), and several nodes share
one host; images are never pulled. Pods of the release reach the API server at their node's address
(testbed/apiserver_access.py), as they would through the kubernetes Service on a real cluster.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from simgpu.config import GpuFaults, NodeSpec, library_dir, make_gpus, write_config
from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS, METRICS_PORT, MIG_DEVICE_CLASS
from tessera.quantity import GiB, MiB
from testbed.apiserver_access import LABEL, let_pods_reach_apiserver, wait_effective
from testbed.cluster import LocalCluster
from testbed.driver_node import ensure_device_class, ensure_mig_device_class
from testbed.helm import CHART, REPO, helm, values_file
from testbed.images import TOOLS_PROGRAMS, ImageSpec, build_image, host_program
from testbed.kubectl import kubectl
from testbed.names import unique_name
from testbed.node import RealNode
from testbed.node_runtime import node_root
from testbed.pod_state import events
from testbed.polling import poll_until
from testbed.product_images import load_manifest, project_version
from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, build_programs

EXAMPLES = REPO / "examples"
GPU_LABEL = "nvidia.com/gpu.present"
# Each release runs on its own nodes only: the session's cluster keeps the nodes of earlier test
# modules, which lack this module's images (installed_release labels the nodes with the release).
CHART_NODE_LABEL = "testbed.tessera.dev/chart-release"
GPUS_PER_NODE = 2
GPU_MEMORY = 80 * GiB
ROLLOUT_TIMEOUT = 300.0
DAEMON_HEALTH_PORT = 51515
"""The node daemon's /healthz and /readyz (kubeletPlugin.healthPort's default), on its node's address:
the test bed runs it in the host network."""


@dataclass
class ChartBed:
    """The release and the nodes it runs on."""

    cluster: LocalCluster
    kube: client.ApiClient
    helm_home: Path
    release: str
    namespace: str
    nodes: list[RealNode]
    values: dict[str, Any]

    def helm(self, *args: str, timeout: float = 600) -> str:
        return helm(
            self.helm_home,
            *args,
            "-n",
            self.namespace,
            kubeconfig=self.cluster.admin_kubeconfig,
            timeout=timeout,
        ).stdout

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        return kubectl(self.cluster.admin_kubeconfig, *args, timeout=timeout)

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component={component}"
        core = client.CoreV1Api(self.kube)
        response = core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        return list(raw_json(response)["items"])

    def log_tails(self) -> dict[str, str]:
        """The nodes' and the release's pods' log tails, for a failing run's report."""
        core = client.CoreV1Api(self.kube)
        tails: dict[str, str] = {}
        for node in self.nodes:
            tails.update(node.log_tails())
        for component in ("kubeletplugin", "exporter", "webhook", "admissioncheck", "webview"):
            for pod in self.pods(component):
                name = pod["metadata"]["name"]
                for container in pod["spec"]["containers"]:
                    key = f"pod {name} container {container['name']}"
                    try:
                        tails[key] = str(
                            core.read_namespaced_pod_log(
                                name, self.namespace, container=container["name"], tail_lines=60
                            )
                        )
                    except client.ApiException as error:
                        tails[key] = f"(no log: {error.reason})"
        return tails


def simulated_gpus(node: RealNode, faults: Mapping[int, GpuFaults] | None = None) -> Path:
    """The node's simulated GPUs: their configuration under the node's own folder. Rewritten with
    ``faults`` (by GPU index), processes already running on the node pick them up."""
    folder = node.paths.root / "simgpu"
    folder.mkdir(exist_ok=True)
    gpus = make_gpus(GPUS_PER_NODE, node.name, memory_bytes=GPU_MEMORY)
    gpus = tuple(replace(gpu, faults=(faults or {}).get(i, gpu.faults)) for i, gpu in enumerate(gpus))
    return write_config(NodeSpec(state_file=folder / "state", gpus=gpus), folder / "simgpu.conf")


def local_image(name: str, version: str | None = None) -> dict[str, str]:
    """The values of a product image (``driver`` or ``webhook``) built and imported locally, at
    ``version`` (by default the checkout's: testbed/product_images.py builds others on request)."""
    image = load_manifest().images[name]
    return {
        "repository": f"tessera.local/{image.repository}",
        "tag": version or project_version(),
        "pullPolicy": "Never",
    }


def node_layout_values(root: str, driver_library_dir: str) -> dict[str, Any]:
    """The daemon's values for nodes that share one host (see the module's docstring): each
    node's kubelet root, CDI folder and claim state in its own folder under ``root``, the driver's
    libraries mounted by the daemon itself, and the host network. There the ports are the node's:
    a surge pod cannot be scheduled beside the old one (the scheduler's NodePorts filter), so each
    node's daemon is replaced in place. Shared by the real-node install and the chart's template
    and API-server tests, so all three check the same layout."""
    node_folder = f"{root}/$(NODE_NAME)"
    return {
        "driverSource": "own",
        "hostNetwork": True,
        "hostPaths": {
            "nodeRoot": root,
            "kubeletRoot": f"{node_folder}/kubelet",
            "cdiDir": f"{node_folder}/cdi",
            "stateDir": f"{node_folder}/tessera",
            "driverLibraryDir": driver_library_dir,
        },
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
    }


def chart_values(version: str | None = None) -> dict[str, Any]:
    """The values the test bed needs (see the module's docstring), with the images at ``version``."""
    simgpu = f"{node_root()}/$(NODE_NAME)/simgpu"
    return {
        "kubeletPlugin": {
            **node_layout_values(str(node_root()), str(library_dir())),
            "image": local_image("driver", version),
            "env": [{"name": "SIMGPU_CONFIG", "value": f"{simgpu}/simgpu.conf"}],
            "containerEnv": [f"SIMGPU_CONFIG={simgpu}/simgpu.conf"],
            "containerMounts": [simgpu],
            "healthInterval": 1,
            "logLevel": "debug",
        },
        # Soon enough for a test to wait for a waiting pod's Event (the chart's 60 s suits people).
        "webhook": {"image": local_image("webhook", version), "explainWaitingAfterSeconds": 5},
    }


def with_webhook_client_ca(cluster: LocalCluster, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with the webhook trusting the client certificate this cluster's API server presents
    to webhooks (cluster.py), unless they say otherwise: the webhook is installed with
    authentication on, as it is by default everywhere."""
    assert cluster.webhook_client_ca is not None
    webhook = dict(values.get("webhook") or {})
    auth = dict(webhook.get("clientAuth") or {})
    if not any(auth.get(key) for key in ("caBundle", "caSecret", "caConfigMap")):
        auth["caBundle"] = cluster.webhook_client_ca.pair.cert.read_text()
    return {**values, "webhook": {**webhook, "clientAuth": auth}}


def label_node(kube: client.ApiClient, node: RealNode, labels: Mapping[str, str]) -> None:
    client.CoreV1Api(kube).patch_node(node.name, {"metadata": {"labels": dict(labels)}})


def confined_to_release_nodes(values: Mapping[str, Any], release: str) -> dict[str, Any]:
    """``values`` with the daemon, the webhook and (when enabled) the admission check on the nodes
    labelled for ``release`` only, where the values do not place them themselves."""
    selector = {CHART_NODE_LABEL: release}
    out = dict(values)
    for component in ("kubeletPlugin", "webhook"):
        out[component] = {"nodeSelector": selector, **(values.get(component) or {})}
    queue = dict(values.get("queue") or {})
    if queue.get("admissionCheck"):
        queue["admissionCheck"] = {"nodeSelector": selector, **queue["admissionCheck"]}
        out["queue"] = queue
    return out


def wait_rolled_out(bed: ChartBed, timeout: float = ROLLOUT_TIMEOUT) -> None:
    """Until the DaemonSets have one ready, current pod on each node (the exporter's where the values
    enable it), and the webhook (and the admission check, where the values enable it) all their
    replicas (and the web view, where the values enable it); a rollout that does not finish fails
    with the release namespace's events."""
    workloads = [f"daemonset/{bed.release}-kubeletplugin", f"deployment/{bed.release}-webhook"]
    if bed.values.get("exporter", {}).get("enabled", True):
        workloads.append(f"daemonset/{bed.release}-exporter")
    if bed.values.get("queue", {}).get("admissionCheck", {}).get("enabled"):
        workloads.append(f"deployment/{bed.release}-admissioncheck")
    if bed.values.get("webview", {}).get("enabled"):
        workloads.append(f"deployment/{bed.release}-webview")
    for workload in workloads:
        try:
            bed.kubectl(
                "rollout",
                "status",
                "-n",
                bed.namespace,
                workload,
                f"--timeout={int(timeout)}s",
                timeout=timeout + 30,
            )
        except Exception as error:
            raise AssertionError(f"{error}\nevents:\n{events(bed.kube, bed.namespace)}") from error


def example_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def containers_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec", {})
    pod_spec = spec.get("template", {}).get("spec", spec) if document["kind"] != "Pod" else spec
    return list(pod_spec.get("containers", [])) if document["kind"] in ("Pod", "Deployment", "Job") else []


def example_images() -> set[str]:
    """Every image the examples (and so the chart's `helm test`, by default) name."""
    return {
        c["image"]
        for path in EXAMPLES.glob("*.yaml")
        for d in example_documents(path)
        for c in containers_of(d)
    }


def workload_images(out: Path) -> list[Path]:
    """The probe image's files (the tools, shim_probe: a CUDA program that loads libcuda.so.1 as
    applications do) under each name the examples use: the nodes have them, so with IfNotPresent
    the kubelet never pulls, and the manifests apply unchanged."""
    programs = build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    files = {f"/bin/{name}": host_program(name) for name in TOOLS_PROGRAMS}
    files["/bin/shim_probe"] = programs / "shim_probe"
    return [
        build_image(ImageSpec(name, files, command=("/bin/sh",)), out) for name in sorted(example_images())
    ]


def prepare_nodes(cluster: LocalCluster, kube: client.ApiClient, nodes: list[RealNode]) -> None:
    """Give each node its simulated GPUs and the labels the release selects, and let the release's
    pods reach the API server."""
    for node in nodes:
        simulated_gpus(node)
        label_node(kube, node, {GPU_LABEL: "true"})
    let_pods_reach_apiserver(kube, cluster)


@contextlib.contextmanager
def device_class_left_to_the_chart(kube: client.ApiClient) -> Iterator[None]:
    """The chart makes the DeviceClasses gpu.tessera.dev and mig.tessera.dev (``deviceClass.enabled``,
    the default), which modules run earlier on the same cluster made without Helm
    (ensure_device_class, ensure_mig_device_class): Helm refuses to adopt theirs. Theirs are taken
    away for the ``with`` block and put back afterwards (gpu.tessera.dev always, mig.tessera.dev if it
    was there), for the modules that run next on this cluster, whichever order they run in."""
    resource = client.ResourceV1Api(kube)
    had_mig = False
    for name in (DEVICE_CLASS, MIG_DEVICE_CLASS):
        try:
            resource.delete_device_class(name)
        except client.ApiException as error:
            if error.status != 404:
                raise
        else:
            had_mig = had_mig or name == MIG_DEVICE_CLASS
            poll_until(partial(_device_class_gone, resource, name), 30, f"{name} deleted")
    try:
        yield
    finally:
        ensure_device_class(kube)
        if had_mig:
            ensure_mig_device_class(kube)


def _device_class_gone(resource: client.ResourceV1Api, name: str) -> bool:
    try:
        resource.read_device_class(name)
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


@contextlib.contextmanager
def installed_release(
    cluster: LocalCluster,
    kube: client.ApiClient,
    nodes: list[RealNode],
    home: Path,
    values: Mapping[str, Any],
    release: str | None = None,
    namespace: str | None = None,
    uninstall: bool = True,
) -> Iterator[ChartBed]:
    """`helm install` of the chart with ``values`` on ``nodes`` (prepared with prepare_nodes) in a
    namespace of its own; with ``uninstall``, uninstalled and the namespace deleted afterwards. With
    the chart's DeviceClass on, one made outside Helm is set aside meanwhile
    (:func:`device_class_left_to_the_chart`)."""
    with contextlib.ExitStack() as stack:
        if dict(values.get("deviceClass") or {}).get("enabled", True):
            stack.enter_context(device_class_left_to_the_chart(kube))
        yield stack.enter_context(
            _installed(cluster, kube, nodes, home, values, release, namespace, uninstall)
        )


@contextlib.contextmanager
def _installed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    nodes: list[RealNode],
    home: Path,
    values: Mapping[str, Any],
    release: str | None,
    namespace: str | None,
    uninstall: bool,
) -> Iterator[ChartBed]:
    release, namespace = release or unique_name("tessera"), namespace or unique_name("tessera-system")
    for node in nodes:
        label_node(kube, node, {CHART_NODE_LABEL: release})
    values = confined_to_release_nodes(with_webhook_client_ca(cluster, values), release)
    core = client.CoreV1Api(kube)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels={LABEL: "true"}))
    )
    wait_effective(kube, namespace)
    bed = ChartBed(cluster, kube, home, release, namespace, nodes, dict(values))
    try:
        bed.helm("install", release, str(CHART), "-f", str(values_file(home, values)))
        yield bed
    finally:
        if uninstall:
            try:
                bed.helm("uninstall", release, "--wait", "--timeout", "5m")
            finally:
                core.delete_namespace(namespace)


def scrape(address: str) -> str:
    """The text of a node's exporter on port 31995."""
    with urllib.request.urlopen(f"http://{address}:{METRICS_PORT}/metrics", timeout=10) as response:
        return str(response.read().decode())


@dataclass(frozen=True)
class Expected:
    """What one example makes: how many pods, the share each pod's claim gets, and whether its pods
    keep running (the Job's finish)."""

    pods: int
    memory: int
    cores: int
    keeps_running: bool = True


EXAMPLE_SHARES = {
    "hami-pod.yaml": Expected(1, 2000 * MiB, 25),
    "claim-template-pod.yaml": Expected(1, 2 * GiB, 25),
    "deployment.yaml": Expected(2, 1 * GiB, 10),
    "job.yaml": Expected(2, 1024 * MiB, 20, keeps_running=False),
    "shared-claim-pod.yaml": Expected(1, 4 * GiB, 50),
}


def enforcement_script(limit: int) -> str:
    """What the container's own CUDA program sees and may do: total memory, an allocation past the
    limit (CUDA_ERROR_OUT_OF_MEMORY, 2) and one of exactly the limit."""
    return (
        "echo '== info'; shim_probe info; "
        f"echo '== over'; shim_probe alloc mem {limit + 64 * MiB}; "
        f"echo '== fits'; shim_probe alloc mem {limit}"
    )


def node_address(bed: ChartBed, node_name: str) -> str:
    [node] = [n for n in bed.nodes if n.name == node_name]
    return node.address
