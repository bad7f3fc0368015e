"""A real node does what production nodes do for pods: run them, serve their logs and exec through
the kubelet, and remove their containers when they are deleted; and stopping a node gives back
everything it took from the machine."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from testbed.cluster import LocalCluster
from testbed.images import TOOLS_IMAGE
from testbed.kubectl import kubectl, kubectl_argv
from testbed.names import unique_name
from testbed.node import NodeFactory, RealNode
from testbed.polling import poll_until

pytestmark = pytest.mark.e2e

FINISHED = ("Succeeded", "Failed")
# Generous: the CI machines have two cores, shared by the control plane, the node and the tests.
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class StartedPod:
    name: str
    uid: str


def phase(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod.status.phase if pod.status else None


def start_pod(kube: client.ApiClient, namespace: str, node: RealNode, script: str) -> StartedPod:
    """Create a pod running `script` under /bin/sh on the given node (the scheduler places it, by
    the node's hostname label) and return once it is Running or finished."""
    name = unique_name("pod")
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node.name},
            restart_policy="Never",
            # `sleep` as PID 1 ignores SIGTERM; do not wait the default 30 s for it on delete.
            termination_grace_period_seconds=1,
            containers=[
                client.V1Container(name="main", image=TOOLS_IMAGE, command=["/bin/sh", "-c", script])
            ],
        ),
    )
    core = client.CoreV1Api(kube)
    created = core.create_namespaced_pod(namespace, pod)
    assert created.metadata is not None and created.metadata.uid
    poll_until(
        lambda: phase(core, namespace, name) in ("Running", *FINISHED), START_TIMEOUT, f"pod {name} to start"
    )
    return StartedPod(name, created.metadata.uid)


def test_pod_runs_to_completion_and_kubectl_logs_shows_its_output(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, real_node: RealNode
) -> None:
    """A pod scheduled onto a real node runs there to completion (phase Succeeded, on that node), and
    `kubectl logs`, which the API server fetches from the node's kubelet, returns what it printed."""
    pod = start_pod(kube, namespace, real_node, "echo hello from $HOSTNAME")
    core = client.CoreV1Api(kube)

    def finished() -> str | None:
        current = phase(core, namespace, pod.name)
        return current if current in FINISHED else None

    final = poll_until(finished, START_TIMEOUT, f"pod {pod.name} to finish")
    assert final == "Succeeded"
    spec = core.read_namespaced_pod(pod.name, namespace).spec
    assert spec is not None and spec.node_name == real_node.name
    assert (
        kubectl(cluster.admin_kubeconfig, "logs", "-n", namespace, pod.name).strip()
        == f"hello from {pod.name}"
    )


def test_kubectl_exec_runs_a_command_inside_the_pods_container(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, real_node: RealNode
) -> None:
    """`kubectl exec` goes API server -> kubelet -> containerd's stream server and runs the command in
    the pod's container: it sees the pod's hostname and the file the container wrote, and its exit
    status comes back."""
    pod = start_pod(kube, namespace, real_node, "echo written-by-main > /tmp/marker; exec sleep 3600")
    # Running means the container started, not that its script has written the marker yet.
    script = 'echo "$HOSTNAME"; cat /tmp/marker'
    out = poll_until(
        lambda: kubectl(
            cluster.admin_kubeconfig, "exec", "-n", namespace, pod.name, "--", "sh", "-c", script
        ),
        START_TIMEOUT,
        "the container to write its marker",
    )
    assert out.split() == [pod.name, "written-by-main"]
    failed = subprocess.run(
        kubectl_argv(cluster.admin_kubeconfig, "exec", "-n", namespace, pod.name, "--", "sh", "-c", "exit 3"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 3, failed.stderr


def runtime_objects_of_pod(node: RealNode, pod_uid: str) -> tuple[list[str], list[str]]:
    """IDs of the sandboxes and of the containers the node's containerd holds for a pod (found by the
    pod-UID label the kubelet puts on both)."""
    label = f"io.kubernetes.pod.uid={pod_uid}"
    sandboxes = json.loads(node.crictl("pods", "--label", label, "-o", "json"))["items"]
    containers = json.loads(node.crictl("ps", "--all", "--label", label, "-o", "json"))["containers"]
    return [s["id"] for s in sandboxes], [c["id"] for c in containers]


def test_deleting_a_pod_removes_its_containers_from_the_node(
    kube: client.ApiClient, namespace: str, real_node: RealNode
) -> None:
    """While a pod runs, the node's runtime holds its sandbox and container. After the pod is deleted
    the kubelet removes the container at once, and the sandbox and then the pod's log folder at its
    next garbage collection (the kubelet runs it once a minute; the period is not configurable)."""
    pod = start_pod(kube, namespace, real_node, "exec sleep 3600")
    sandboxes, containers = runtime_objects_of_pod(real_node, pod.uid)
    assert (len(sandboxes), len(containers)) == (1, 1)
    log_folder = real_node.paths.pod_logs / f"{namespace}_{pod.name}_{pod.uid}"
    assert log_folder.is_dir()

    client.CoreV1Api(kube).delete_namespaced_pod(pod.name, namespace)
    poll_until(lambda: not runtime_objects_of_pod(real_node, pod.uid)[1], 90, "the container to go")
    # The garbage collection removes the sandbox, then the log folder: one after the other, not at once.
    poll_until(lambda: runtime_objects_of_pod(real_node, pod.uid) == ([], []), 180, "the sandbox to go")
    poll_until(lambda: not log_folder.exists(), 180, "the pod's log folder to go")


# What a node takes from the machine, read here from the kernel's own files rather than through the
# test bed's clean-up helpers, so that a mistake shared by both cannot hide.


def mount_points_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder`` in this mount namespace (/proc/self/mountinfo)."""
    prefix = str(folder)
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    # mountinfo escapes spaces and the like as octal; the node folders have none.
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def cgroup_folders(name: str) -> list[Path]:
    """The folder ``/<name>`` in every mounted cgroup hierarchy (/proc/self/mounts)."""
    folders = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        if kind in ("cgroup", "cgroup2"):
            folders.append(Path(point) / name)
    return folders


def processes_naming(folder: Path) -> list[int]:
    """Processes whose command line names ``folder`` (containerd and its shims)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_stopping_a_node_gives_back_everything_it_took(
    kube: client.ApiClient, namespace: str, node_factory: NodeFactory
) -> None:
    """Stopping a real node that runs a pod gives back what it took from the machine: its bridge,
    its cgroup tree in every hierarchy, every mount under its folder (the pod's root filesystem,
    shared memory and the like), its containerd, shims and the container's process, the folder
    itself, and its Node object. Each of these is first seen to exist while the node runs, so
    the test cannot pass for want of anything to clean."""
    (node,) = node_factory.start(1)  # a node of its own: the session's shared one stays up
    pod = start_pod(kube, namespace, node, "exec sleep 3600")
    folder = node.paths.root
    assert node.runtime.bridge is not None
    bridge = Path("/sys/class/net") / node.runtime.bridge.name
    cgroups = cgroup_folders(node.runtime.cgroup_root)
    (container,) = runtime_objects_of_pod(node, pod.uid)[1]
    container_pid = int(json.loads(node.crictl("inspect", container))["info"]["pid"])

    assert bridge.exists()
    assert cgroups and all(group.is_dir() for group in cgroups)
    assert mount_points_under(folder)
    assert processes_naming(folder)
    assert alive(container_pid)
    assert folder.is_dir()

    node.stop()

    assert not bridge.exists()
    assert [group for group in cgroups if group.exists()] == []
    assert mount_points_under(folder) == []
    assert processes_naming(folder) == []
    assert not alive(container_pid)
    assert not folder.exists()
    with pytest.raises(ApiException) as gone:
        client.CoreV1Api(kube).read_node(node.name)
    assert gone.value.status == 404
