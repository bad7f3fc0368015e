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
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.driver.discovery import Gpu
from tessera.names import CORES_CAPACITY, MEMORY_CAPACITY, PRODUCT_ATTRIBUTE, UUID_ATTRIBUTE
from tessera.quantity import MiB, round_down

log = logging.getLogger(__name__)

MEMORY_STEP = MiB
CORES_TOTAL = 100
STANDARD_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def shareable(gpus: Sequence[Gpu]) -> list[Gpu]:
    """The GPUs to publish. GPUs in MIG mode are left out (and logged): their memory and compute
    belong to MIG instances, which the shim cannot divide further and which isolate tenants better
    than it does; publish those with a MIG-aware driver."""
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


def device(gpu: Gpu, taints: Sequence[DeviceTaint] = ()) -> dict[str, Any]:
    """The Device for ``gpu``: attributes, consumable memory and cores, and a NoSchedule taint for
    each of ``taints`` (running shares are left to their owners)."""
    memory = round_down(gpu.memory_bytes, MEMORY_STEP)
    major, minor = gpu.cuda_compute_capability
    cuda = gpu.cuda_driver_version
    attributes: dict[str, Mapping[str, object]] = {
        "type": {"string": "gpu"},
        UUID_ATTRIBUTE: {"string": gpu.uuid},
        "index": {"int": gpu.index},
        PRODUCT_ATTRIBUTE: {"string": gpu.product_name},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": version(f"{major}.{minor}")},
        "driverVersion": {"version": version(gpu.driver_version)},
        "cudaDriverVersion": {"version": version(f"{cuda // 1000}.{cuda % 1000 // 10}")},
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
