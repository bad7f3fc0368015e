"""A GPU record to the resource.k8s.io/v1 Device the scheduler allocates from: pure, no I/O.

The request policy is the product's promise about one-dimensional claims, so it is stated here
once (docs/driver.md explains it to users):

- ``memory`` (bytes, 1Mi steps, 0 to the whole GPU): a claim that does not name memory reserves
  none and gets a memory limit of 0 — it can run kernels on memory it does not own only if it
  allocates nothing. A share holds exactly the memory it reserved, so memory is never overcommitted.
- ``cores`` (percent of the GPU's time, 1 steps, 0-100): a claim that does not name cores reserves
  none and is not compute-capped (it time-slices with the rest); a claim that names cores is capped
  at them. The sum of the caps never exceeds 100.

Neither default is "the whole device", so a claim that names one dimension never makes the GPU
exclusive by accident (HAMi's DRA driver defaults both to the whole GPU).

A GPU in MIG mode is not shareable: each of its MIG instances is published instead as a device of
its own, exclusive (one claim at a time, no consumable capacity: the hardware divides the GPU, the
shim does not), with its profile, its parent GPU and its memory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.driver.discovery import Gpu, MigDevice
from tessera.names import (
    CORES_CAPACITY,
    DEVICE_TYPE_ATTRIBUTE,
    MEMORY_CAPACITY,
    MIG_PROFILE_ATTRIBUTE,
    PARENT_UUID_ATTRIBUTE,
    PRODUCT_ATTRIBUTE,
    UUID_ATTRIBUTE,
)
from tessera.quantity import MiB, round_down

log = logging.getLogger(__name__)

MEMORY_STEP = MiB
CORES_TOTAL = 100
STANDARD_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
MIG_DEVICE_PREFIX = "mig-"
"""Every MIG device's name starts so (a GPU's with "gpu-"): prepare tells a vanished instance by it."""


def shareable(gpus: Sequence[Gpu]) -> list[Gpu]:
    """The GPUs that can be shared (what the exporter watches). GPUs in MIG mode are left out (and
    logged): their memory and compute belong to MIG instances, which the shim cannot divide further
    and which isolate tenants better than it does; the daemon publishes those instances instead."""
    out = []
    for gpu in gpus:
        if gpu.mig_enabled:
            log.warning("GPU %s (%s) is in MIG mode; not publishing it for sharing", gpu.index, gpu.uuid)
        else:
            out.append(gpu)
    log.info("found %d GPUs to share: %s", len(out), ", ".join(f"{g.index}:{g.uuid}" for g in out) or "none")
    return out


def device_name(gpu: Gpu) -> str:
    """A DNS label that names the same physical GPU across restarts, reboots and renumbering:
    derived from its UUID, never from its index."""
    return "gpu-" + gpu.uuid.lower().removeprefix("gpu-")


def mig_device_name(mig: MigDevice) -> str:
    """A DNS label for a MIG instance, from its UUID: "MIG-<uuid>" on current drivers, and the older
    "MIG-GPU-<uuid>/<gi>/<ci>" form made label-safe."""
    body = "".join(c if c.isalnum() else "-" for c in mig.uuid.lower().removeprefix("mig-"))
    return (MIG_DEVICE_PREFIX + body)[:63].rstrip("-")


def published_names(gpu: Gpu) -> list[str]:
    """The names of the devices a GPU is published as: its MIG instances in MIG mode, else itself."""
    if gpu.mig_enabled:
        return [mig_device_name(m) for m in gpu.mig_devices]
    return [device_name(gpu)]


def node_devices(gpus: Sequence[Gpu], taints: Mapping[str, Sequence[DeviceTaint]]) -> list[dict[str, Any]]:
    """Every device of the node's slice: each shareable GPU, and each MIG instance of a GPU in MIG
    mode; ``taints`` (by GPU UUID) apply to a GPU and to every instance of it alike."""
    out = []
    for gpu in gpus:
        gpu_taints = taints.get(gpu.uuid, ())
        if not gpu.mig_enabled:
            out.append(device(gpu, gpu_taints))
            continue
        if not gpu.mig_devices:
            log.warning(
                "GPU %s (%s) is in MIG mode with no MIG instances: nothing of it to publish",
                gpu.index,
                gpu.uuid,
            )
        out.extend(mig_device(gpu, mig, gpu_taints) for mig in gpu.mig_devices)
    return out


def version(text: str) -> str:
    """A semantic version for a DRA version attribute: "550.54.15" stays, "9.0" becomes "9.0.0"."""
    parts = [str(int(p)) for p in text.split(".")[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" in the standard attribute's form "0000:3b:00.0"."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


@dataclass(frozen=True)
class DeviceTaint:
    """Why no new share may land on a GPU now: a NoSchedule taint under ``key`` (tessera/names.py),
    its value the ``reason`` made label-safe, added at ``since`` (RFC 3339) when known."""

    key: str
    reason: str
    since: str | None = None


def _gpu_attributes(gpu: Gpu) -> dict[str, Mapping[str, object]]:
    """What a GPU and each of its MIG instances alike say about the physical GPU."""
    major, minor = gpu.cuda_compute_capability
    cuda = gpu.cuda_driver_version
    return {
        "index": {"int": gpu.index},
        PRODUCT_ATTRIBUTE: {"string": gpu.product_name},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": version(f"{major}.{minor}")},
        "driverVersion": {"version": version(gpu.driver_version)},
        "cudaDriverVersion": {"version": version(f"{cuda // 1000}.{cuda % 1000 // 10}")},
    }


def mig_device(gpu: Gpu, mig: MigDevice, taints: Sequence[DeviceTaint] = ()) -> dict[str, Any]:
    """The Device for one MIG instance of ``gpu``: exclusive (no allowMultipleAllocations, so one
    claim holds it whole), its memory as plain capacity, its parent's taints."""
    attributes: dict[str, Mapping[str, object]] = {
        DEVICE_TYPE_ATTRIBUTE: {"string": "mig"},
        MIG_PROFILE_ATTRIBUTE: {"string": mig.profile},
        UUID_ATTRIBUTE: {"string": mig.uuid},
        PARENT_UUID_ATTRIBUTE: {"string": gpu.uuid},
        **_gpu_attributes(gpu),
    }
    result: dict[str, Any] = {
        "name": mig_device_name(mig),
        "attributes": attributes,
        "capacity": {MEMORY_CAPACITY: {"value": str(mig.memory_bytes)}},
    }
    if taints:
        result["taints"] = [_taint(taint) for taint in taints]
    return result


def device(gpu: Gpu, taints: Sequence[DeviceTaint] = ()) -> dict[str, Any]:
    """The Device for ``gpu``: attributes, consumable memory and cores, and a NoSchedule taint for
    each of ``taints`` (running shares are left to their owners)."""
    memory = round_down(gpu.memory_bytes, MEMORY_STEP)
    attributes: dict[str, Mapping[str, object]] = {
        DEVICE_TYPE_ATTRIBUTE: {"string": "gpu"},
        UUID_ATTRIBUTE: {"string": gpu.uuid},
        **_gpu_attributes(gpu),
        STANDARD_PCI_BUS_ID: {"string": pci_bus_id(gpu.pci_bus_id)},
    }
    result: dict[str, Any] = {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            MEMORY_CAPACITY: {
                "value": str(memory),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(memory), "step": str(MEMORY_STEP)},
                },
            },
            CORES_CAPACITY: {
                "value": str(CORES_TOTAL),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(CORES_TOTAL), "step": "1"},
                },
            },
        },
    }
    if taints:
        result["taints"] = [_taint(taint) for taint in taints]
    return result


def _taint(taint: DeviceTaint) -> dict[str, str]:
    out = {"key": taint.key, "value": _taint_value(taint.reason), "effect": "NoSchedule"}
    if taint.since:
        out["timeAdded"] = taint.since
    return out


def _taint_value(problem: str) -> str:
    """A taint value is a label value: 63 characters of [A-Za-z0-9._-]; the full message goes to the
    health service and the log."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in problem)
    return cleaned[:63].strip("-._") or "unhealthy"
