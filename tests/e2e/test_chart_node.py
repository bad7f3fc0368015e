"""The chart on real nodes: `helm install` of charts/tessera runs the node daemon (DaemonSet) and the
webhook (Deployment) as pods from the locally built images (testbed/product_images.py, the same
images images/Dockerfile builds) on two test-bed nodes with simulated GPUs. The examples in
examples/, applied with kubectl unchanged, run with their shares placed and their limits enforced
inside the containers; `helm test` passes; port 31995 on each node answers with the examples'
metrics; `helm upgrade` with changed values rolls the DaemonSet and a prepared claim survives it.

What the test bed sets through values, and why: each node's kubelet root, CDI folder and claim
state live in its own folder (hostPaths.nodeRoot plus $(NODE_NAME)); the simulated driver's
libraries and configuration stand where NVIDIA's would (driverSource own, driverLibraryDir,
SIMGPU_CONFIG); the daemon runs in the host network, bound to its node's address, because the test
bed has neither kube-proxy (NodePort) nor the CNI portmap plugin (hostPort), and several nodes share
one host; images are never pulled. Pods of the release reach the API server at their node's address
(testbed/apiserver_access.py), as they would through the kubernetes Service on a real cluster.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import raw_json
from tessera.names import METRICS_PORT
from tessera.quantity import GiB
from tessera.simgpu.config import NodeSpec, library_dir, make_gpus, write_config
from tessera.testbed.apiserver_access import LABEL, let_pods_reach_apiserver, wait_effective
from tessera.testbed.cluster import LocalCluster
from tessera.testbed.kubectl import kubectl
from tessera.testbed.names import unique_name
from tessera.testbed.node import NodeFactory, RealNode
from tessera.testbed.node_runtime import node_root
from tessera.testbed.polling import poll_until
from tessera.testbed.product_images import load_manifest, product_images, project_version
from tests.chart_helm import CHART, helm, values_file
from tests.e2e.test_driver_node import PROBE_IMAGE, events, probe_image

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]  # the fixture, shared with the driver's end-to-end tests

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GPU_LABEL = "nvidia.com/gpu.present"
# Only this module's nodes get the webhook (other modules' nodes lack the images).
CHART_NODE_LABEL = "testbed.tessera.dev/chart-node"
GPUS_PER_NODE = 2
GPU_MEMORY = 80 * GiB
ROLLOUT_TIMEOUT = 300.0


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
        """The nodes' and the release's pods' log tails, for a failing test's report."""
        core = client.CoreV1Api(self.kube)
        tails: dict[str, str] = {}
        for node in self.nodes:
            tails.update(node.log_tails())
        for component in ("kubeletplugin", "webhook"):
            for pod in self.pods(component):
                name = pod["metadata"]["name"]
                try:
                    tails[f"pod {name}"] = str(
                        core.read_namespaced_pod_log(name, self.namespace, tail_lines=60)
                    )
                except client.ApiException as error:
                    tails[f"pod {name}"] = f"(no log: {error.reason})"
        return tails


def simulated_gpus(node: RealNode) -> Path:
    """The node's simulated GPUs: their configuration under the node's own folder."""
    folder = node.paths.root / "simgpu"
    folder.mkdir(exist_ok=True)
    spec = NodeSpec(
        state_file=folder / "state", gpus=make_gpus(GPUS_PER_NODE, node.name, memory_bytes=GPU_MEMORY)
    )
    return write_config(spec, folder / "simgpu.conf")


def chart_values(probe_image_reference: str) -> dict[str, Any]:
    """The values the test bed needs (see the module's docstring)."""
    manifest = load_manifest()
    images = {name: f"tessera.local/{image.repository}" for name, image in manifest.images.items()}
    node_folder = f"{node_root()}/$(NODE_NAME)"
    simgpu = f"{node_folder}/simgpu"
    repository, _, tag = probe_image_reference.rpartition(":")
    return {
        "kubeletPlugin": {
            "image": {"repository": images["driver"], "tag": project_version(), "pullPolicy": "Never"},
            "driverSource": "own",
            "hostNetwork": True,
            "hostPaths": {
                "nodeRoot": str(node_root()),
                "kubeletRoot": f"{node_folder}/kubelet",
                "cdiDir": f"{node_folder}/cdi",
                "stateDir": f"{node_folder}/tessera",
                "driverLibraryDir": str(library_dir()),
            },
            "env": [{"name": "SIMGPU_CONFIG", "value": f"{simgpu}/simgpu.conf"}],
            "containerEnv": [f"SIMGPU_CONFIG={simgpu}/simgpu.conf"],
            "containerMounts": [simgpu],
            "healthInterval": 1,
            "logLevel": "debug",
        },
        "webhook": {
            "image": {"repository": images["webhook"], "tag": project_version(), "pullPolicy": "Never"},
            "nodeSelector": {CHART_NODE_LABEL: "true"},
        },
        "tests": {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}},
    }


def label_node(kube: client.ApiClient, node: RealNode) -> None:
    labels = {GPU_LABEL: "true", CHART_NODE_LABEL: "true"}
    client.CoreV1Api(kube).patch_node(node.name, {"metadata": {"labels": labels}})


def wait_rolled_out(bed: ChartBed, timeout: float = ROLLOUT_TIMEOUT) -> None:
    """Until the DaemonSet has one ready, current pod on each node and the webhook all its replicas."""
    bed.kubectl(
        "rollout",
        "status",
        "-n",
        bed.namespace,
        f"daemonset/{bed.release}-kubeletplugin",
        f"--timeout={int(timeout)}s",
        timeout=timeout + 30,
    )
    bed.kubectl(
        "rollout",
        "status",
        "-n",
        bed.namespace,
        f"deployment/{bed.release}-webhook",
        f"--timeout={int(timeout)}s",
        timeout=timeout + 30,
    )


@pytest.fixture(scope="module")
def chart_bed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    node_factory: NodeFactory,
    probe_image: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChartBed]:
    archives = product_images()
    nodes = node_factory.start(2, extra_images=[*archives.values(), probe_image])
    for node in nodes:
        simulated_gpus(node)
        label_node(kube, node)
    let_pods_reach_apiserver(kube, cluster)
    release, namespace = unique_name("tessera"), unique_name("tessera-system")
    core = client.CoreV1Api(kube)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels={LABEL: "true"}))
    )
    wait_effective(kube, namespace)
    home = tmp_path_factory.mktemp("helm")
    values = chart_values(PROBE_IMAGE)
    bed = ChartBed(cluster, kube, home, release, namespace, nodes, values)
    try:
        bed.helm("install", release, str(CHART), "-f", str(values_file(home, values)))
        yield bed
    finally:
        try:
            bed.helm("uninstall", release, "--wait", "--timeout", "5m")
        finally:
            core.delete_namespace(namespace)


def test_helm_install_runs_the_daemonset_and_the_webhook_as_pods_from_the_local_images(
    chart_bed: ChartBed,
) -> None:
    bed = chart_bed
    try:
        wait_rolled_out(bed)
    except Exception as error:
        raise AssertionError(f"{error}\nevents:\n{events(bed.kube, bed.namespace)}") from error
    daemons = bed.pods("kubeletplugin")
    assert sorted(p["spec"]["nodeName"] for p in daemons) == sorted(n.name for n in bed.nodes)
    manifest = load_manifest()
    for pod in daemons:
        [container] = pod["spec"]["containers"]
        assert (
            container["image"] == f"tessera.local/{manifest.images['driver'].repository}:{project_version()}"
        )
    webhooks = bed.pods("webhook")
    assert len(webhooks) == 2
    assert all(
        p["spec"]["containers"][0]["image"].startswith(
            f"tessera.local/{manifest.images['webhook'].repository}:"
        )
        for p in webhooks
    )
    resource = client.ResourceV1Api(bed.kube)
    for node in bed.nodes:
        slices = raw_json(
            resource.list_resource_slice(field_selector=f"spec.nodeName={node.name}", _preload_content=False)
        )["items"]
        devices = [d for s in slices for d in s["spec"]["devices"]]
        assert len(devices) == GPUS_PER_NODE, slices


def test_helm_test_passes(chart_bed: ChartBed) -> None:
    wait_rolled_out(chart_bed)
    out = chart_bed.helm("test", chart_bed.release, "--timeout", "5m", "--logs", timeout=400)
    assert "Phase:          Succeeded" in out, out
    assert "Phase:          Failed" not in out, out


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}:{METRICS_PORT}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_port_31995_on_each_node_answers_with_per_gpu_metrics(chart_bed: ChartBed) -> None:
    wait_rolled_out(chart_bed)
    for node in chart_bed.nodes:
        text = poll_until(partial(scrape, node.address), 60, f"metrics on {node.address}:{METRICS_PORT}")
        assert "tessera_" in text
        for gpu in make_gpus(GPUS_PER_NODE, node.name, memory_bytes=GPU_MEMORY):
            assert gpu.uuid in text, f"{gpu.uuid} not in the metrics of {node.name}"
