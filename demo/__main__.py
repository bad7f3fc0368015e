"""The Tessera demo: `make demo`.

Today it shows the foundation every later part stands on: a real control plane on loopback that
shares one GPU between pods through DRA consumable capacity. It starts the cluster, publishes one
80Gi/100-core GPU on a node, asks for three 30Gi/40-core shares, shows what the real scheduler did
(two shares placed with distinct shareIDs, the third Pending with its reason), and stops.
"""

from __future__ import annotations

import logging
import sys

from kubernetes import client

from tessera.kube import api_client
from tessera.names import DEVICE_CLASS
from tessera.testbed import dra_objects, pod_state
from tessera.testbed.cluster import LocalCluster
from tessera.testbed.fake_nodes import create_ready_node
from tessera.testbed.interrupts import interrupt_on_sigterm
from tessera.testbed.kubectl import kubectl
from tessera.testbed.polling import poll_until

NAMESPACE = "demo"
# What kubectl shows of slices and claims: the share each claim got, on which device.
SLICE_COLUMNS = (
    "NODE:.spec.nodeName,DEVICE:.spec.devices[0].name,MEMORY:.spec.devices[0].capacity.memory.value,"
    "CORES:.spec.devices[0].capacity.cores.value,SHAREABLE:.spec.devices[0].allowMultipleAllocations"
)
_RESULT = ".status.allocation.devices.results[0]"
CLAIM_COLUMNS = (
    f"CLAIM:.metadata.name,DEVICE:{_RESULT}.device,SHARE:{_RESULT}.shareID,"
    f"MEMORY:{_RESULT}.consumedCapacity.memory,CORES:{_RESULT}.consumedCapacity.cores"
)
CONDITIONS = '{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\\n"}{end}'
NODE = "gpu-node-1"


def show(cluster: LocalCluster, *args: str) -> None:
    """Run the real kubectl against the demo cluster, echoing the command and its output."""
    print(f"\n$ kubectl {' '.join(args)}", flush=True)
    print(kubectl(cluster.admin_kubeconfig, *args), end="", flush=True)


def run_story(cluster: LocalCluster) -> None:
    """Publish one GPU, ask for three shares, and check the scheduler did what the demo says."""
    kube = api_client(cluster.admin_kubeconfig)
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    show(cluster, "version")

    create_ready_node(kube, NODE)
    resource.create_device_class(dra_objects.device_class(DEVICE_CLASS))
    resource.create_resource_slice(dra_objects.shareable_gpu_slice(f"{NODE}-gpus", NODE))
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    poll_until(lambda: core.read_namespaced_service_account("default", NAMESPACE), 30, "service account")
    share = {"memory": "30Gi", "cores": "40"}
    resource.create_namespaced_resource_claim_template(
        NAMESPACE, dra_objects.share_claim_template("gpu-share", DEVICE_CLASS, share)
    )
    # One at a time, so the story reads the same on every run: two fit, the third does not.
    share_ids = []
    for pod in ("train-a", "train-b"):
        core.create_namespaced_pod(NAMESPACE, dra_objects.pod_with_claim(pod, "gpu-share"))
        claim = pod_state.wait_until_claim_allocated(resource, core, NAMESPACE, pod, "gpu")
        share_ids.append(pod_state.single_allocation_result(claim).share_id)
        pod_state.wait_until_bound(core, NAMESPACE, pod)
    if len(set(share_ids)) != 2:
        raise RuntimeError(f"the two shares did not get distinct share IDs: {share_ids}")
    core.create_namespaced_pod(NAMESPACE, dra_objects.pod_with_claim("train-c", "gpu-share"))
    pod_state.wait_until_unschedulable(core, NAMESPACE, "train-c")

    show(cluster, "get", "resourceslices", "-o", f"custom-columns={SLICE_COLUMNS}")
    show(cluster, "get", "pods", "-n", NAMESPACE, "-o", "wide")
    show(cluster, "get", "resourceclaims", "-n", NAMESPACE, "-o", f"custom-columns={CLAIM_COLUMNS}")
    show(cluster, "get", "pod", "train-c", "-n", NAMESPACE, "-o", f"jsonpath={CONDITIONS}")
    print("\nTwo 30Gi/40-core shares fit on the 80Gi GPU; the third does not, and says why.")


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    interrupt_on_sigterm()
    print("Starting a local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)...")
    with LocalCluster() as cluster:
        try:
            run_story(cluster)
        finally:
            print("Stopping the control plane and removing its state.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
