"""What the watched objects say about free capacity: the driver's GPUs (not the tainted ones), what
allocated claims take, and whether a pod's shares are already counted."""

from __future__ import annotations

from typing import Any

from tessera.admissioncheck.inventory import allocated_usage, gpus_from_slices, pod_record
from tessera.quantity import GiB
from testbed.queue_bed import gpu_devices


def a_slice(node: str, devices: list[dict[str, Any]], driver: str = "gpu.tessera.dev") -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices}}


def test_the_drivers_devices_become_gpus_and_tainted_or_foreign_ones_do_not() -> None:
    devices = gpu_devices("node-a", [80, 40])
    devices[1]["taints"] = [{"key": "gpu.tessera.dev/unhealthy", "effect": "NoSchedule"}]
    gpus = gpus_from_slices(
        [a_slice("node-a", devices), a_slice("node-b", gpu_devices("node-b", [80]), "other")]
    )
    assert [(g.node, g.memory, g.cores, g.uuid) for g in gpus] == [("node-a", 80 * GiB, 100, "GPU-node-a-0")]
    assert gpus[0].product == "NVIDIA A100-SXM4-80GB"


def claim(device: str, memory: str, cores: str, allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [
                    {
                        "driver": "gpu.tessera.dev",
                        "pool": "node-a",
                        "device": device,
                        "consumedCapacity": {"memory": memory, "cores": cores},
                    }
                ]
            }
        }
    return {"metadata": {"name": device, "namespace": "ns"}, "status": status}


def test_allocated_claims_add_up_per_gpu_and_unallocated_ones_take_nothing() -> None:
    used = allocated_usage(
        [claim("gpu-0", "10Gi", "30"), claim("gpu-0", "2Gi", "0"), claim("gpu-1", "1Gi", "1", False)]
    )
    assert used == {("node-a", "gpu-0"): (12 * GiB, 30)}


def test_a_pod_counts_as_placed_once_bound_finished_or_all_its_claims_are_allocated() -> None:
    def pod(**status: Any) -> dict[str, Any]:
        spec = {"nodeName": status.pop("node")} if "node" in status else {}
        return {
            "metadata": {"uid": "u", "namespace": "ns", "ownerReferences": [{"uid": "job"}]},
            "spec": spec,
            "status": status,
        }

    claims = {("ns", "c0"): claim("gpu-0", "1Gi", "1"), ("ns", "c1"): claim("gpu-1", "1Gi", "1", False)}
    assert not pod_record(pod(phase="Pending"), claims).placed
    assert pod_record(pod(node="node-a"), claims).placed
    assert pod_record(pod(phase="Succeeded"), claims).placed
    assert pod_record(pod(resourceClaimStatuses=[{"resourceClaimName": "c0"}]), claims).placed
    both = [{"resourceClaimName": "c0"}, {"resourceClaimName": "c1"}]
    assert not pod_record(pod(resourceClaimStatuses=both), claims).placed
    assert pod_record(pod(), claims).owners == frozenset({"job"})
