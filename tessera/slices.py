"""The GPUs our driver's ResourceSlices publish, read once for everyone who reads them.

The driver writes each GPU as a resource.k8s.io/v1 Device (tessera/driver/devices.py); the webhook
(can a request ever be placed?) and the admission check (does a workload fit now?) read them back.
Both read through :func:`published_gpus`, so a device the driver publishes means the same GPU to
both, and a malformed or foreign device is skipped the same way.

A GPU is tainted by its slice (the daemon's health and cordon taints) or by a DeviceTaintRule an
operator writes (docs/driver.md "Cordoning a GPU"), which the scheduler treats exactly like a taint in
the slice; :func:`with_taint_rules` adds the rules' taints to the GPUs they select.

What a reader does with a tainted GPU is its own decision, made visibly with
:attr:`PublishedGpu.schedulable`: the scheduler places nothing new on a GPU whose taint says
NoSchedule or NoExecute, so the admission check leaves such GPUs out of today's free capacity; the
webhook counts them, because a taint means "unhealthy now", and refusing a pod at creation is final
while the GPU may recover within minutes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tessera.names import (
    CORES_CAPACITY,
    DEVICE_TYPE_ATTRIBUTE,
    DRIVER_NAME,
    MEMORY_CAPACITY,
    PRODUCT_ATTRIBUTE,
    UUID_ATTRIBUTE,
)
from tessera.quantity import quantity_to_int

BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects under which the scheduler allocates nothing new from a device."""

SHAREABLE_TYPE = "gpu"
"""The type attribute of a device that shares can be cut from."""

WHOLE_GPU_CORES = 100
"""A GPU's compute, in the cores capacity's unit (percent), when a slice does not say."""

GpuKey = tuple[str, str]
"""(pool, device name): how a DRA allocation result names a device."""


@dataclass(frozen=True)
class PublishedGpu:
    """One GPU as a ResourceSlice publishes it: where it is, what it is, its whole capacity, and the
    keys of the taints that keep new allocations off it."""

    node: str
    pool: str
    name: str
    uuid: str
    product: str
    memory: int
    cores: int
    blocking_taints: tuple[str, ...] = ()

    @property
    def key(self) -> GpuKey:
        return (self.pool, self.name)

    @property
    def schedulable(self) -> bool:
        """Whether the scheduler may allocate new shares of it."""
        return not self.blocking_taints


def published_gpus(slices: Iterable[Mapping[str, Any]]) -> list[PublishedGpu]:
    """Every shareable GPU our driver publishes in ``slices`` (ResourceSlice objects as JSON), in
    slice and device order. Slices of other drivers are ignored, and so are devices whose memory
    capacity is missing or not a quantity (nothing can be allocated from them) and devices of
    another type than "gpu" (MIG instances: whole devices, never shares). A device without a type is
    a GPU, as slices written before MIG support say."""
    gpus = []
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        pool = (spec.get("pool") or {}).get("name") or ""
        node = spec.get("nodeName") or pool
        for device in spec.get("devices") or []:
            gpu = _published_gpu(node, pool, device)
            if gpu is not None:
                gpus.append(gpu)
    return gpus


def _published_gpu(node: str, pool: str, device: Mapping[str, Any]) -> PublishedGpu | None:
    capacity = device.get("capacity") or {}
    attributes = device.get("attributes") or {}
    kind = attributes.get(DEVICE_TYPE_ATTRIBUTE)
    if kind is not None and (not isinstance(kind, Mapping) or kind.get("string") != SHAREABLE_TYPE):
        return None
    try:
        memory = quantity_to_int(capacity[MEMORY_CAPACITY]["value"])
        cores = quantity_to_int((capacity.get(CORES_CAPACITY) or {}).get("value", str(WHOLE_GPU_CORES)))
        name = str(device["name"])
    except (KeyError, TypeError, ValueError):
        return None
    return PublishedGpu(
        node=node,
        pool=pool,
        name=name,
        uuid=str((attributes.get(UUID_ATTRIBUTE) or {}).get("string", "")),
        product=str((attributes.get(PRODUCT_ATTRIBUTE) or {}).get("string", "")),
        memory=memory,
        cores=cores,
        blocking_taints=tuple(
            str(taint.get("key", ""))
            for taint in device.get("taints") or []
            if taint.get("effect") in BLOCKING_TAINT_EFFECTS
        ),
    )


def with_taint_rules(gpus: Iterable[PublishedGpu], rules: Iterable[Mapping[str, Any]]) -> list[PublishedGpu]:
    """``gpus`` with the NoSchedule and NoExecute taints of the DeviceTaintRules (resource.k8s.io/v1,
    as JSON) that select them added to their blocking taints. A rule selects a device when each of
    its selector's ``driver``, ``pool`` and ``device`` that is set names it (an empty selector
    selects every device); a rule without a selector selects none, as the API defines it."""
    blocking = [
        (selector, str(taint.get("key", "")))
        for rule in rules
        if (selector := (rule.get("spec") or {}).get("deviceSelector")) is not None
        and (taint := (rule.get("spec") or {}).get("taint") or {}).get("effect") in BLOCKING_TAINT_EFFECTS
    ]
    out = []
    for gpu in gpus:
        added = tuple(key for selector, key in blocking if _selects(selector, gpu))
        out.append(replace(gpu, blocking_taints=gpu.blocking_taints + added) if added else gpu)
    return out


def _selects(selector: Mapping[str, Any], gpu: PublishedGpu) -> bool:
    return all(
        selector.get(field) in (None, value)
        for field, value in (("driver", DRIVER_NAME), ("pool", gpu.pool), ("device", gpu.name))
    )
