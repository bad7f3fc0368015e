"""The cluster's GPUs, their shares and their MIG instances as plain data, from one snapshot; pure.

GPUs are read with the same readers the admission check decides with (tessera/slices.py for the
devices and their taints, :func:`tessera.admissioncheck.inventory.allocated_usage` for what
allocated claims take), so "allocated" here is the figure a fit decision subtracts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.admissioncheck.inventory import allocated_usage, claim_shares
from tessera.kubectl.snapshot import Snapshot
from tessera.names import (
    DEVICE_TYPE_ATTRIBUTE,
    MEMORY_CAPACITY,
    MIG_PROFILE_ATTRIBUTE,
    PARENT_UUID_ATTRIBUTE,
    UNHEALTHY_TAINT,
    UNMONITORED_TAINT,
    UUID_ATTRIBUTE,
)
from tessera.quantity import quantity_to_int
from tessera.slices import GpuKey, PublishedGpu, published_gpus, with_taint_rules

HEALTH_TAINTS = frozenset({UNHEALTHY_TAINT, UNMONITORED_TAINT})
"""Taints the driver sets for health; any other blocking taint is an operator's cordon (the
driver's for ``hami.io/device-cordon``, or a DeviceTaintRule)."""


@dataclass(frozen=True)
class Share:
    """One allocated share: the claim, the pod using it, the GPU, what it takes."""

    namespace: str
    claim: str
    pod: str
    key: GpuKey
    memory: int
    cores: int


def claim_pod(claim: Mapping[str, Any]) -> str:
    """The pod a claim belongs to: its owner when generated from a pod's template, else the pod
    that reserved it; '' when neither is known."""
    metadata = claim.get("metadata") or {}
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == "Pod":
            return str(owner.get("name", ""))
    for consumer in (claim.get("status") or {}).get("reservedFor") or []:
        if consumer.get("resource") == "pods":
            return str(consumer.get("name", ""))
    return ""


def shares(claims: Iterable[Mapping[str, Any]]) -> list[Share]:
    """Every device result of our driver in the claims' allocations, one share each."""
    out = []
    for claim in claims:
        metadata = claim.get("metadata") or {}
        for key, memory, cores in claim_shares(claim):
            out.append(
                Share(
                    namespace=str(metadata.get("namespace", "")),
                    claim=str(metadata.get("name", "")),
                    pod=claim_pod(claim),
                    key=(str(key[0]), str(key[1])),
                    memory=memory,
                    cores=cores,
                )
            )
    return out


def cordoned_nodes(nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes marked unschedulable (``kubectl cordon``): the scheduler places no new pod there."""
    return {
        str((node.get("metadata") or {}).get("name", ""))
        for node in nodes
        if (node.get("spec") or {}).get("unschedulable")
    }


def all_gpus(snapshot: Snapshot) -> list[PublishedGpu]:
    """Every shareable GPU our driver publishes, schedulable or not, with DeviceTaintRules' taints."""
    return with_taint_rules(published_gpus(snapshot.slices), snapshot.taint_rules)


def is_cordon(taint: str) -> bool:
    return taint not in HEALTH_TAINTS


def gpu_rows(snapshot: Snapshot) -> list[dict[str, Any]]:
    """One entry per GPU: what it is, what is allocated of it, its taints, its shares."""
    gpus = all_gpus(snapshot)
    used = allocated_usage(snapshot.claims)
    by_gpu: dict[GpuKey, list[Share]] = {}
    for share in shares(snapshot.claims):
        by_gpu.setdefault(share.key, []).append(share)
    node_cordons = cordoned_nodes(snapshot.nodes)
    rows = []
    for gpu in gpus:
        memory, cores = used.get(gpu.key, (0, 0))
        rows.append(
            {
                "node": gpu.node,
                "nodeCordoned": gpu.node in node_cordons,
                "device": gpu.name,
                "uuid": gpu.uuid,
                "product": gpu.product,
                "memory": {"capacity": gpu.memory, "allocated": memory},
                "cores": {"capacity": gpu.cores, "allocated": cores},
                "taints": list(gpu.blocking_taints),
                "cordoned": any(is_cordon(t) for t in gpu.blocking_taints),
                "shares": [
                    {
                        "namespace": s.namespace,
                        "pod": s.pod,
                        "claim": s.claim,
                        "memory": s.memory,
                        "cores": s.cores,
                    }
                    for s in by_gpu.get(gpu.key, [])
                ],
            }
        )
    return rows


def mig_rows(snapshot: Snapshot) -> list[dict[str, Any]]:
    """One entry per MIG instance our driver publishes: its profile, its GPU, the claim holding it."""
    holders = {share.key: share for share in shares(snapshot.claims)}
    rows = []
    for item in snapshot.slices:
        spec = item.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            if (attributes.get(DEVICE_TYPE_ATTRIBUTE) or {}).get("string") != "mig":
                continue
            name = str(device.get("name", ""))
            holder = holders.get((pool, name))
            try:
                memory: int | None = quantity_to_int(
                    ((device.get("capacity") or {}).get(MEMORY_CAPACITY) or {}).get("value", "")
                )
            except ValueError:
                memory = None
            rows.append(
                {
                    "node": str(spec.get("nodeName") or pool),
                    "device": name,
                    "uuid": str((attributes.get(UUID_ATTRIBUTE) or {}).get("string", "")),
                    "profile": str((attributes.get(MIG_PROFILE_ATTRIBUTE) or {}).get("string", "")),
                    "parent": str((attributes.get(PARENT_UUID_ATTRIBUTE) or {}).get("string", "")),
                    "memory": memory,
                    "claim": f"{holder.namespace}/{holder.claim}" if holder else "",
                    "pod": holder.pod if holder else "",
                }
            )
    return rows


def share_rows(snapshot: Snapshot, namespace: str | None) -> list[dict[str, Any]]:
    """One entry per share of ``namespace``'s claims (every namespace's when None), with its GPU
    and its limits."""
    gpus = {gpu.key: gpu for gpu in all_gpus(snapshot)}
    rows = []
    for share in shares(snapshot.claims):
        if namespace is not None and share.namespace != namespace:
            continue
        gpu = gpus.get(share.key)
        rows.append(
            {
                "namespace": share.namespace,
                "pod": share.pod,
                "claim": share.claim,
                "node": gpu.node if gpu else share.key[0],
                "device": share.key[1],
                "uuid": gpu.uuid if gpu else "",
                "memoryLimit": share.memory,
                "coresLimit": share.cores or None,
            }
        )
    return rows
