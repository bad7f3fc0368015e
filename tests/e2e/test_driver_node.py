"""The whole node path with the real programs: the scheduler places shares from the daemon's slices,
the real kubelet prepares them through our sockets, containerd applies our CDI specs, and a CUDA
program in the container runs against the simulated GPU through the preloaded shim — limited to its
claim without setting anything itself. Then the same under kills, a kubelet restart and a reboot.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.driver.state import PREPARE_STEPS
from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS, DRIVER_NAME
from tessera.quantity import GiB, MiB, quantity_to_int
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.images import TOOLS_PROGRAMS, ImageSpec, build_image, host_program
from testbed.node import NodeFactory, RealNode
from testbed.pod_state import events, generated_claim_name, sections
from testbed.polling import poll_until
from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, build_programs

pytestmark = pytest.mark.e2e

__all__ = ["events", "sections"]

PROBE_IMAGE = "tessera.local/cuda-probe:v1"


@pytest.fixture(scope="module")
def probe_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tools image plus shim_probe, a CUDA program that loads libcuda.so.1 as applications do."""
    programs = build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    files = {f"/bin/{name}": host_program(name) for name in TOOLS_PROGRAMS}
    files["/bin/shim_probe"] = programs / "shim_probe"
    return build_image(ImageSpec(PROBE_IMAGE, files, command=("/bin/sh",)), tmp_path_factory.mktemp("images"))


class GpuNode:
    def __init__(self, node: RealNode, driver: DriverNode) -> None:
        self.node, self.driver = node, driver

    @property
    def name(self) -> str:
        return self.node.name

    def gpu_uuid(self, index: int) -> str:
        return self.driver.simgpu.spec.gpus[index].uuid

    def log_tails(self) -> dict[str, str]:
        return {**self.node.log_tails(), **self.driver.log_tails()}


@contextlib.contextmanager
def one_gpu_node(
    cluster: LocalCluster,
    kube: client.ApiClient,
    node_factory: NodeFactory,
    probe_image: Path,
    before_start: Callable[[DriverNode], None] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[GpuNode]:
    """One real node with 2 simulated 80 GiB GPUs and the daemon (``extra_args`` on its command
    line) registered and published; the daemon cleaned up on exit. ``before_start`` may change the
    simulated GPUs (MIG mode, say) before the daemon first reads them."""
    ensure_device_class(kube)
    (node,) = node_factory.start(1, extra_images=[probe_image])
    driver = DriverNode(
        cluster, node.name, kubelet_root=node.paths.kubelet_root, cdi_dir=node.paths.cdi_dir, gpus=2
    )
    if before_start is not None:
        before_start(driver)
    try:
        driver.start(extra_args=extra_args)
        driver.wait_ready()
        yield GpuNode(node, driver)
    finally:
        driver.cleanup()


@pytest.fixture(scope="module")
def gpu_nodes(
    cluster: LocalCluster, kube: client.ApiClient, node_factory: NodeFactory, probe_image: Path
) -> Iterator[list[GpuNode]]:
    """Two real nodes, each with 4 simulated 80 GiB GPUs and the daemon registered and published."""
    ensure_device_class(kube)
    nodes = node_factory.start(2, extra_images=[probe_image])
    drivers = [
        DriverNode(cluster, n.name, kubelet_root=n.paths.kubelet_root, cdi_dir=n.paths.cdi_dir, gpus=4)
        for n in nodes
    ]
    try:
        for driver in drivers:
            driver.start()
        for driver in drivers:
            driver.wait_ready()
        yield [GpuNode(n, d) for n, d in zip(nodes, drivers, strict=True)]
    finally:
        for driver in drivers:
            driver.cleanup()


def run_share_pod(
    kube: client.ApiClient,
    namespace: str,
    node: GpuNode,
    name: str,
    requests: list[dict[str, str]],
    script: str,
    gpu_uuid: str | None = None,
    wait: bool = True,
    restart_policy: str = "Never",
) -> str:
    """A pod on ``node`` whose claim template has one request per entry of ``requests`` (capacity
    maps), optionally pinned to one GPU by UUID; runs ``script`` in the probe image. Returns its
    log once the script is done (or "" without ``wait``)."""
    selectors = (
        [{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].uuid == "{gpu_uuid}"'}}]
        if gpu_uuid
        else []
    )
    template = {
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": f"r{i}",
                            "exactly": {
                                "deviceClassName": DEVICE_CLASS,
                                "selectors": selectors,
                                "capacity": {"requests": capacity},
                            },
                        }
                        for i, capacity in enumerate(requests)
                    ]
                }
            }
        },
    }
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(
        namespace, client.V1ResourceClaimTemplate.model_validate(template)
    )
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "probe",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))
    if not wait:
        return ""
    return wait_done(kube, namespace, name)


DONE = "== done"


def wait_done(kube: client.ApiClient, namespace: str, name: str, timeout: float = 180) -> str:
    """The pod's log once its script has printed DONE. The pods then sleep instead of exiting: the
    controller manager deletes a finished pod's generated claim, which the tests still read."""
    core = client.CoreV1Api(kube)

    def done() -> str | None:
        status = core.read_namespaced_pod(name, namespace).status
        if status is not None and status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"{name} ended ({status.phase}):\n{events(kube, namespace)}")
        if status is None or status.phase != "Running":
            return None
        log = str(core.read_namespaced_pod_log(name, namespace))
        return log if DONE in log else None

    try:
        return str(poll_until(done, timeout, f"{namespace}/{name} to print {DONE!r}"))
    except TimeoutError as error:
        raise AssertionError(f"{error}\nevents:\n{events(kube, namespace)}") from error


def limit_script(limit: int) -> str:
    over = limit + 64 * MiB
    return (
        "echo '== info'; shim_probe info; "
        f"echo '== over'; shim_probe alloc mem {over}; "
        f"echo '== unset'; env -u LD_PRELOAD LD_PRELOAD= shim_probe alloc mem {over}; "
        f"echo '== fits'; shim_probe alloc mem {limit}; "
        "echo '== preload'; cat /etc/ld.so.preload; "
        f"echo '{DONE}'; exec sleep 3600"
    )


def claim_of(kube: client.ApiClient, namespace: str, pod: str, entry: str = "gpu") -> dict[str, Any]:
    """The ResourceClaim made for the pod's claim entry ``entry``."""
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    name = generated_claim_name(core.read_namespaced_pod(pod, namespace), entry)
    assert name is not None
    return raw_json(resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))


def test_three_shares_of_one_gpu_each_see_and_get_exactly_their_claim(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str
) -> None:
    """20Gi/30, 20Gi/30 and 40Gi/40 of one 80Gi GPU: each container's cuMemGetInfo shows its claim,
    an allocation past it fails with CUDA_ERROR_OUT_OF_MEMORY (2) — also with LD_PRELOAD unset, since
    /etc/ld.so.preload loads the shim — while an allocation of exactly its claim succeeds next to
    the neighbours on the same GPU."""
    node = gpu_nodes[0]
    uuid = node.gpu_uuid(0)
    shares = {"a": (20, "30"), "b": (20, "30"), "c": (40, "40")}
    for name, (gib, cores) in shares.items():
        run_share_pod(
            kube,
            namespace,
            node,
            name,
            [{"memory": f"{gib}Gi", "cores": cores}],
            limit_script(gib * GiB),
            uuid,
            wait=False,
        )
    for name, (gib, cores) in shares.items():
        seen = sections(wait_done(kube, namespace, name))
        assert int(seen["info"]["total"]) == gib * GiB, seen
        assert seen["over"]["rc"] == "2", seen
        assert seen["unset"]["rc"] == "2", seen
        assert seen["fits"]["rc"] == "0", seen
        (result,) = claim_of(kube, namespace, name)["status"]["allocation"]["devices"]["results"]
        consumed = {k: quantity_to_int(v) for k, v in result["consumedCapacity"].items()}
        assert consumed == {"memory": gib * GiB, "cores": int(cores)}
    preload = wait_done(kube, namespace, "a").split("== preload", 1)[1].split(DONE)[0].split()
    assert preload == [
        "/run/tessera/shim/libtessera-cuda.so",
        "/run/tessera/shim/libtessera-nvml.so",
    ]


def test_a_claim_with_two_shares_of_one_gpu_gets_two_cdi_devices_and_both_limits(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str
) -> None:
    node = gpu_nodes[0]
    log = run_share_pod(
        kube,
        namespace,
        node,
        "two",
        [{"memory": "10Gi", "cores": "10"}, {"memory": "6Gi", "cores": "5"}],
        limit_script(16 * GiB),
        node.gpu_uuid(1),
    )
    seen = sections(log)
    assert int(seen["info"]["total"]) == 16 * GiB
    assert (seen["over"]["rc"], seen["fits"]["rc"]) == ("2", "0")
    claim = claim_of(kube, namespace, "two")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len({r["shareID"] for r in results}) == 2 and len({r["device"] for r in results}) == 1
    spec_file = node.node.paths.cdi_dir / f"k8s.gpu.tessera.dev-claim_{claim['metadata']['uid']}.json"
    names = [d["name"] for d in json.loads(spec_file.read_text())["devices"]]
    assert names == [f"{claim['metadata']['uid']}-{r['device']}-{r['shareID']}" for r in results]


@pytest.mark.parametrize("crash_point", PREPARE_STEPS)
def test_a_daemon_killed_mid_prepare_is_retried_by_the_kubelet_and_prepares_once(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str, crash_point: str
) -> None:
    node = gpu_nodes[1]
    node.driver.stop()
    node.driver.start(crash_point=crash_point)
    node.driver.wait_serving()
    node.driver.wait_ready()
    run_share_pod(
        kube, namespace, node, "crash", [{"memory": "3Gi", "cores": "7"}], limit_script(3 * GiB), wait=False
    )
    process = node.driver.process
    assert process is not None
    poll_until(lambda: not process.running(), 120, f"the daemon to kill itself at {crash_point}")
    node.driver.start()
    seen = sections(wait_done(kube, namespace, "crash"))
    assert int(seen["info"]["total"]) == 3 * GiB
    uid = claim_of(kube, namespace, "crash")["metadata"]["uid"]
    assert (node.driver.state_dir / "claims" / uid / "limits").exists()
    specs = [p.name for p in node.node.paths.cdi_dir.glob(f"*{uid}*")]
    assert specs == [f"k8s.gpu.tessera.dev-claim_{uid}.json"]


def test_after_a_kubelet_restart_the_plugin_is_registered_again_and_its_slice_is_back(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str
) -> None:
    """The kubelet deletes its node's slices when it starts; the daemon republishes and the kubelet
    registers it again from the socket in its registry, so new pods are prepared as before."""
    node = gpu_nodes[1]
    registered_before = node.driver.process.log_tail(10_000).count("registered with the kubelet")  # type: ignore[union-attr]
    node.node.restart_kubelet()
    poll_until(
        lambda: node.driver.process.log_tail(10_000).count("registered with the kubelet") > registered_before,  # type: ignore[union-attr]
        60,
        "registration with the restarted kubelet",
    )
    node.driver.wait_published()
    seen = sections(
        run_share_pod(
            kube, namespace, node, "after", [{"memory": "5Gi", "cores": "5"}], limit_script(5 * GiB)
        )
    )
    assert int(seen["info"]["total"]) == 5 * GiB


def test_after_a_reboot_the_running_claims_are_prepared_again_and_their_containers_restart(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str
) -> None:
    """A reboot empties /var/run/cdi and changes the boot ID; the daemon finds its claims still
    allocated and writes them again, so a container the runtime must recreate still starts."""
    node = gpu_nodes[1]
    core = client.CoreV1Api(kube)
    run_share_pod(
        kube,
        namespace,
        node,
        "long",
        [{"memory": "2Gi", "cores": "2"}],
        "shim_probe info; exec sleep 3600",
        wait=False,
        restart_policy="Always",
    )
    poll_until(lambda: container_status(core, namespace, "long").state.running, 120, "long Running")  # type: ignore[union-attr]
    uid = claim_of(kube, namespace, "long")["metadata"]["uid"]
    node.driver.stop()
    for spec in node.node.paths.cdi_dir.glob("k8s.gpu.tessera.dev-claim_*.json"):
        spec.unlink()
    node.driver.reboot()
    node.driver.start()
    spec_file = node.node.paths.cdi_dir / f"k8s.gpu.tessera.dev-claim_{uid}.json"
    poll_until(spec_file.exists, 60, "the claim prepared again after the reboot")
    container_id = container_status(core, namespace, "long").container_id
    assert container_id is not None
    node.node.crictl("rm", "--force", container_id.split("://", 1)[1])

    def recreated() -> bool:
        status = container_status(core, namespace, "long")
        return status.restart_count >= 1 and status.state is not None and status.state.running is not None

    poll_until(recreated, 180, "the container recreated and running")


def container_status(core: client.CoreV1Api, namespace: str, pod: str) -> client.V1ContainerStatus:
    status = core.read_namespaced_pod(pod, namespace).status
    assert status is not None and status.container_statuses
    return status.container_statuses[0]


def test_a_share_that_cannot_be_prepared_says_why_in_the_pods_events_and_the_claim(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """A node whose NVIDIA control device exists but whose GPU device node is missing: the daemon
    refuses to write a spec without it (nv#1380), and says so in one sentence that the kubelet
    puts in the pod's events and the daemon puts in the claim's Ready condition."""
    node = gpu_nodes[1]
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "nvidiactl").touch()
    node.driver.stop()
    node.driver.start(extra_args=[f"--device-dir={devices}"])
    node.driver.wait_ready()
    try:
        run_share_pod(kube, namespace, node, "broken", [{"memory": "1Gi", "cores": "1"}], "true", wait=False)
        sentence = "is missing although the NVIDIA driver is loaded"
        poll_until(lambda: sentence in events(kube, namespace), 120, "the failure in the pod's events")
        pod_events = [e for e in events(kube, namespace).splitlines() if sentence in e]
        assert pod_events[0].startswith("broken: FailedPrepareDynamicResources:"), pod_events
        statuses = poll_until(
            lambda: claim_of(kube, namespace, "broken")["status"].get("devices"),
            30,
            "the claim's device status",
        )
        (status,) = statuses
        (ready,) = status["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "PrepareFailed")
        assert sentence in ready["message"]
    finally:
        node.driver.stop()
        node.driver.start()
        node.driver.wait_ready()


def test_a_corrupt_checkpoint_is_quarantined_and_running_claims_stay_prepared(
    gpu_nodes: list[GpuNode], kube: client.ApiClient, namespace: str
) -> None:
    """The daemon never crash-loops on its checkpoint: a damaged one is moved aside, the running
    pod's claim is rebuilt from the API and the claim folders, and new pods are prepared as before."""
    node = gpu_nodes[1]
    run_share_pod(kube, namespace, node, "kept", [{"memory": "1Gi", "cores": "1"}], limit_script(GiB))
    uid = claim_of(kube, namespace, "kept")["metadata"]["uid"]
    node.driver.stop()
    checkpoint = node.driver.state_dir / "checkpoint.json"
    checkpoint.write_bytes(checkpoint.read_bytes()[:40])
    node.driver.start()
    node.driver.wait_ready()
    assert list(node.driver.state_dir.glob("checkpoint.json.quarantined-*"))
    rebuilt = json.loads(checkpoint.read_text())["data"]["claims"]
    assert rebuilt[uid]["state"] == "PrepareCompleted"
    seen = sections(
        run_share_pod(kube, namespace, node, "next", [{"memory": "2Gi", "cores": "1"}], limit_script(2 * GiB))
    )
    assert int(seen["info"]["total"]) == 2 * GiB
