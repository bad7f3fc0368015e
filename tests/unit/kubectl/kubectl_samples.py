"""The objects the kubectl plugin's unit tests judge and show: our driver's slices as the driver
writes them (tessera/driver/devices.py), pods as the webhook converts them (testbed/queue_bed.py),
and claims with the allocation the scheduler writes (testbed/dra_objects.py), put together in a
snapshot without an API server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.driver.slices import slice_object
from tessera.kubectl.snapshot import Snapshot
from tessera.names import CORDONED_TAINT, DRIVER_NAME
from testbed.dra_objects import share_claim
from testbed.queue_bed import gpu_devices, plain_gpu_pod_objects

H100 = "NVIDIA H100 80GB HBM3"
NAMESPACE = "team"


def gpu_slice(
    node: str, memories_gi: Sequence[int], product: str = H100, cordoned: Sequence[int] = ()
) -> dict[str, Any]:
    """``node``'s slice with GPUs of these sizes (UUIDs GPU-<node>-<index>), those at the indexes
    ``cordoned`` carrying the driver's cordon taint."""
    devices = gpu_devices(node, memories_gi, product)
    for index in cordoned:
        devices[index]["taints"] = [{"key": CORDONED_TAINT, "value": "cordoned", "effect": "NoSchedule"}]
    return slice_object(node, f"uid-{node}", DRIVER_NAME, devices, 1)


def device_name(node: str, index: int) -> str:
    """The driver's device name for GPU ``index`` of ``node`` (from its UUID)."""
    return f"gpu-{node}-{index}"


def used(node: str, index: int, memory: str, name: str, cores: str = "10", pod: str = "") -> dict[str, Any]:
    """An allocated claim taking ``memory``/``cores`` of that GPU, owned by ``pod`` when given."""
    claim = share_claim(name, NAMESPACE, node, device_name(node, index), memory, cores)
    if pod:
        claim["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": pod, "apiVersion": "v1", "uid": "u"}]
    return claim


def waiting(
    name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(template, pod) of a pending pod asking ``limits`` as the webhook converts it."""
    return plain_gpu_pod_objects(NAMESPACE, name, None, limits, annotations)


def snapshot(
    slices: Sequence[dict[str, Any]],
    claims: Sequence[dict[str, Any]] = (),
    templates: Sequence[dict[str, Any]] = (),
    nodes: Sequence[dict[str, Any]] = (),
    taint_rules: Sequence[dict[str, Any]] = (),
) -> Snapshot:
    return Snapshot(
        slices=list(slices),
        claims=list(claims),
        templates=list(templates),
        nodes=list(nodes),
        taint_rules=list(taint_rules),
    )
