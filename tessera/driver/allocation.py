"""A ResourceClaim's allocation to the shares this node must prepare: pure, no I/O.

The scheduler writes, per allocated device, the request, pool, device, shareID and the capacity it
consumed; what the shim must enforce follows from those alone, so turning a claim into shares can
be repeated any number of times with the same result (a retried prepare computes the same thing).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.driver.devices import MIG_DEVICE_PREFIX
from tessera.names import CORES_CAPACITY, MEMORY_CAPACITY
from tessera.quantity import quantity_to_int


class AllocationError(ValueError):
    """A claim this node cannot prepare; the message is one sentence for the pod's events."""


@dataclass(frozen=True)
class Share:
    """One allocated share of one GPU."""

    request: str
    """The claim's request name, without a firstAvailable subrequest (the kubelet matches these)."""
    pool: str
    device: str
    share_id: str | None
    memory_bytes: int
    cores: int


@dataclass(frozen=True)
class GpuLimit:
    """What the claim may use of one GPU: the sum of its shares of that GPU."""

    device: str
    memory_bytes: int
    cores: int


def claim_ref(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def shares(
    claim: Mapping[str, Any],
    driver: str,
    pool: str,
    devices: Sequence[str],
    exclusive: Collection[str] = (),
) -> list[Share]:
    """The shares of ``claim`` that ``driver`` must prepare on ``pool``, in allocation order.

    ``devices`` are the device names this node publishes; an allocation naming another device of
    our pool (a GPU that has gone, a stale slice) is refused rather than guessed at. ``exclusive``
    ones (MIG instances) are allocated whole, without consumed capacity: their share holds 0."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise AllocationError(f"ResourceClaim {claim_ref(claim)} is not allocated yet")
    results = (allocation.get("devices") or {}).get("results") or []
    out: list[Share] = []
    for result in results:
        if result.get("driver") != driver:
            continue
        if result.get("pool") != pool:
            raise AllocationError(
                f"ResourceClaim {claim_ref(claim)} has device {result.get('device')} of pool "
                f"{result.get('pool')}, which is not this node's pool {pool}"
            )
        device = str(result.get("device", ""))
        if device not in devices and device.startswith(MIG_DEVICE_PREFIX):
            raise AllocationError(
                f"ResourceClaim {claim_ref(claim)} was allocated MIG instance {device}, which is gone "
                "from this node (its GPU left MIG mode or the instance was destroyed); delete the pod "
                "so that it is placed again"
            )
        if device not in devices:
            raise AllocationError(
                f"ResourceClaim {claim_ref(claim)} was allocated device {device}, which this node "
                f"does not have (it has {', '.join(sorted(devices)) or 'no GPUs'})"
            )
        consumed = result.get("consumedCapacity")
        if consumed is None and device in exclusive:
            consumed = {}
        if consumed is None:
            raise AllocationError(
                f"ResourceClaim {claim_ref(claim)} has no consumed capacity for {device}: the "
                "scheduler must run with the DRAConsumableCapacity feature"
            )
        try:
            memory = quantity_to_int(consumed.get(MEMORY_CAPACITY, "0"))
            cores = quantity_to_int(consumed.get(CORES_CAPACITY, "0"))
        except ValueError as error:
            raise AllocationError(f"ResourceClaim {claim_ref(claim)}: {error}") from None
        out.append(
            Share(
                request=str(result.get("request", "")).split("/", 1)[0],
                pool=pool,
                device=device,
                share_id=result.get("shareID"),
                memory_bytes=memory,
                cores=cores,
            )
        )
    if not out:
        raise AllocationError(f"ResourceClaim {claim_ref(claim)} has no device of driver {driver}")
    return out


def limits(claim_shares: Sequence[Share]) -> list[GpuLimit]:
    """Per GPU, in first-seen order: the claim's shares of it added up (two shares of one GPU give
    the sum of both), cores capped at the whole GPU."""
    totals: dict[str, tuple[int, int]] = {}
    for share in claim_shares:
        memory, cores = totals.get(share.device, (0, 0))
        totals[share.device] = (memory + share.memory_bytes, cores + share.cores)
    return [GpuLimit(device, memory, min(cores, 100)) for device, (memory, cores) in totals.items()]
