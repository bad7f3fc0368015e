"""The Tessera demo: `make demo`.

Today it shows the foundation every later part stands on: a real control plane on loopback that
shares one GPU between pods through DRA consumable capacity. It starts the cluster, publishes one
80Gi/100-core GPU on a node, asks for three 30Gi/40-core shares, shows what the real scheduler did
(two shares placed with distinct shareIDs, the third Pending with its reason), and stops.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys

from kubernetes import client

from tessera.kube import api_client
from tessera.testbed import dra_objects, pod_state
from tessera.testbed.binaries import binary
from tessera.testbed.cluster import LocalCluster
from tessera.testbed.fake_nodes import create_ready_node
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


def kubectl(cluster: LocalCluster, *args: str) -> None:
    """Run the real kubectl against the demo cluster and show its output."""
    print(f"\n$ kubectl {' '.join(args)}", flush=True)
    env = {**os.environ, "KUBECONFIG": str(cluster.admin_kubeconfig)}
    subprocess.run([str(binary("kubectl")), *args], env=env, check=True)


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    print("Starting a local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)...")
    with LocalCluster() as cluster:
        kube = api_client(cluster.admin_kubeconfig)
        core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
        kubectl(cluster, "version")

        create_ready_node(kube, NODE)
        resource.create_device_class(dra_objects.device_class(dra_objects.DRIVER))
        resource.create_resource_slice(dra_objects.shareable_gpu_slice(f"{NODE}-gpus", NODE))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        poll_until(lambda: core.read_namespaced_service_account("default", NAMESPACE), 30, "service account")
        resource.create_namespaced_resource_claim_template(
            NAMESPACE,
            dra_objects.share_claim_template(
                "gpu-share", dra_objects.DRIVER, {"memory": "30Gi", "cores": "40"}
            ),
        )

        def scheduling_decision(pod: str) -> client.V1PodCondition | None:
            return pod_state.condition(core.read_namespaced_pod(pod, NAMESPACE), "PodScheduled")

        # One at a time, so the story reads the same on every run: two fit, the third does not.
        for pod in ("train-a", "train-b", "train-c"):
            core.create_namespaced_pod(NAMESPACE, dra_objects.pod_with_claim(pod, "gpu-share"))
            poll_until(functools.partial(scheduling_decision, pod), 60, f"the scheduler to decide on {pod}")

        kubectl(cluster, "get", "resourceslices", "-o", f"custom-columns={SLICE_COLUMNS}")
        kubectl(cluster, "get", "pods", "-n", NAMESPACE, "-o", "wide")
        kubectl(cluster, "get", "resourceclaims", "-n", NAMESPACE, "-o", f"custom-columns={CLAIM_COLUMNS}")
        kubectl(cluster, "get", "pod", "train-c", "-n", NAMESPACE, "-o", f"jsonpath={CONDITIONS}")
        print("\nTwo 30Gi/40-core shares fit on the 80Gi GPU; the third does not, and says why.")
        print("Stopping the control plane and removing its state.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
