"""Node objects with no kubelet behind them, for control-plane tests.

The scheduler places pods only on Ready nodes with allocatable resources; with the node-lifecycle
controller off (see cluster.py) such a node stays Ready for the life of the test. Pods bound to it
are never started: tests of scheduling and allocation need nothing more, and
:func:`report_succeeded` ends a pod as its kubelet would.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubernetes import client

DEFAULT_ALLOCATABLE = {"cpu": "16", "memory": "64Gi", "pods": "110"}


def create_ready_node(
    api: client.ApiClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> client.V1Node:
    """Create a Node and mark its status Ready with the given allocatable resources."""
    core = client.CoreV1Api(api)
    resources = dict(allocatable or DEFAULT_ALLOCATABLE)
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **(labels or {})})
        )
    )
    # status is a subresource: the create above drops it, so it is written separately.
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "FakeNodeReady",
                    "message": "fake node of the Tessera test bed: no kubelet runs behind it",
                }
            ],
        }
    }
    core.patch_node_status(name, status)
    # The API server's TaintNodesByCondition admission taints every new node not-ready; a kubelet
    # would lift it on its first Ready heartbeat, and with no kubelet the test bed lifts it here.
    node = core.patch_node(name, {"spec": {"taints": []}})
    if node.spec and node.spec.taints:
        raise RuntimeError(f"node {name} kept taints {node.spec.taints} after they were cleared")
    return node


def report_succeeded(core: client.CoreV1Api, namespace: str, pod: str, container: str) -> None:
    """Write the status a kubelet reports for a pod whose one container exited 0, so the Job
    controller, Kueue and the claim controller see the pod finish as on a real node."""
    report_exit(core, namespace, pod, container, 0)


def report_exit(core: client.CoreV1Api, namespace: str, pod: str, container: str, code: int) -> None:
    """Write the status a kubelet reports for a pod whose one container exited with ``code``:
    Succeeded for 0, Failed otherwise."""
    status = {
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [
                {
                    "name": container,
                    "image": "tessera.local/none",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
                    },
                }
            ],
        }
    }
    core.patch_namespaced_pod_status(pod, namespace, status)
