"""A claim's per-share settings (priority, enforcement) from its allocation's opaque configuration:
pure, no I/O.

The webhook writes non-default settings as a ``ShareConfig`` in the claim's ``spec.devices.config``
(docs/driver.md, "Share configuration"); the scheduler copies every configuration into
``status.allocation.devices.config`` (the class's first, then the claim's), which is what this
module reads, so what is prepared is what was allocated. Any namespace user can write a
ResourceClaim by hand, so the parse is strict and bounded: an unknown apiVersion, kind or key, a
value of the wrong type or out of range refuses the claim with one sentence,
``enforcement: "off"`` is honoured only on a whole GPU, and priority 0 only in a namespace the
administrator granted it (:func:`settings`; tessera/priority_grant.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.driver.allocation import AllocationError, GpuLimit, Share, claim_ref, limits
from tessera.driver.devices import CORES_TOTAL
from tessera.priority_grant import HIGH_PRIORITY, granted, refusal

API_VERSION = "gpu.tessera.dev/v1"
KIND = "ShareConfig"
PRIORITY_HIGH = HIGH_PRIORITY
PRIORITY_LOW = 1
"""HAMi's default, and ours."""
ENFORCEMENT_ON = "on"
ENFORCEMENT_OFF = "off"
_KEYS = ("apiVersion", "kind", "priority", "enforcement")
MAX_CONFIGS = 32
"""The API's own bound on configuration entries."""


@dataclass(frozen=True)
class ShareConfig:
    """The settings of one request's shares."""

    priority: int = PRIORITY_LOW
    enforcement: str = ENFORCEMENT_ON


@dataclass(frozen=True)
class ClaimSettings:
    """What prepare does with a claim's settings."""

    priorities: Mapping[str, int]
    """Per allocated device: its shares' highest priority (0 beats 1)."""
    enforced: bool
    """False only for a claim that asked for enforcement off and holds whole GPUs: no shim."""


def parse(claim: Mapping[str, Any], parameters: object) -> dict[str, Any]:
    """The keys a ShareConfig sets (only those present), or AllocationError naming what is wrong."""
    where = f"ResourceClaim {claim_ref(claim)}: the {KIND} in its configuration"
    if not isinstance(parameters, Mapping):
        raise AllocationError(f"{where} is not an object")
    unknown = sorted(str(k) for k in parameters if k not in _KEYS)
    if unknown:
        raise AllocationError(f"{where} has unknown key {unknown[0]!r} (it takes {', '.join(_KEYS)})")
    if parameters.get("apiVersion") != API_VERSION or parameters.get("kind") != KIND:
        raise AllocationError(
            f"ResourceClaim {claim_ref(claim)}: its configuration for this driver must be apiVersion "
            f"{API_VERSION!r}, kind {KIND!r}, not {parameters.get('apiVersion')!r}, "
            f"{parameters.get('kind')!r}"
        )
    out: dict[str, Any] = {}
    if "priority" in parameters:
        priority = parameters["priority"]
        # bool is an int in Python; JSON true is not a priority.
        if isinstance(priority, bool) or priority not in (PRIORITY_HIGH, PRIORITY_LOW):
            raise AllocationError(f"{where} has priority {priority!r}; it must be 0 (high) or 1 (low)")
        out["priority"] = int(priority)
    if "enforcement" in parameters:
        enforcement = parameters["enforcement"]
        if enforcement not in (ENFORCEMENT_ON, ENFORCEMENT_OFF):
            raise AllocationError(f'{where} has enforcement {enforcement!r}; it must be "on" or "off"')
        out["enforcement"] = enforcement
    return out


def configs(claim: Mapping[str, Any], driver: str, requests: Sequence[str]) -> dict[str, ShareConfig]:
    """Per request name in ``requests``: its settings, from every configuration entry of
    ``driver`` that names it (or names no request), later entries' keys over earlier ones'."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    entries = (allocation.get("devices") or {}).get("config") or []
    if not isinstance(entries, list) or len(entries) > MAX_CONFIGS:
        raise AllocationError(
            f"ResourceClaim {claim_ref(claim)} has an allocation configuration that is not a list of at "
            f"most {MAX_CONFIGS} entries"
        )
    settings: dict[str, dict[str, Any]] = {request: {} for request in requests}
    for entry in entries:
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        keys = parse(claim, opaque.get("parameters"))
        named = entry.get("requests") or []
        # A configuration may name a firstAvailable subrequest ("gpu/large"): it is the request's.
        names = {str(name).split("/", 1)[0] for name in named} if isinstance(named, list) else set()
        for request in requests:
            if not names or request in names:
                settings[request].update(keys)
    return {request: ShareConfig(**keys) for request, keys in settings.items()}


def settings(
    claim: Mapping[str, Any],
    driver: str,
    shares: Sequence[Share],
    capacity: Mapping[str, int],
    high_priority_namespaces: Collection[str] = frozenset(),
) -> ClaimSettings:
    """The claim's priorities and whether the shim enforces its limits. ``capacity`` is each
    device's published memory (bytes). Priority 0 on any request needs the claim's namespace in
    ``high_priority_namespaces`` (the webhook checks pods written for HAMi; a claim written by hand
    reaches only this check). Enforcement off on any request needs every GPU of the claim whole
    (all its memory and all its cores), since all the claim's containers get the same spec;
    otherwise AllocationError says what it holds."""
    per_request = configs(claim, driver, sorted({s.request for s in shares}))
    high = [r for r, c in per_request.items() if c.priority == PRIORITY_HIGH]
    namespace = str((claim.get("metadata") or {}).get("namespace", ""))
    if high and not granted(namespace, high_priority_namespaces):
        raise AllocationError(
            f"ResourceClaim {claim_ref(claim)}: priority 0 (high), asked by request {high[0]}, "
            + refusal(namespace)
        )
    priorities: dict[str, int] = {}
    for share in shares:
        priority = per_request[share.request].priority
        priorities[share.device] = min(priority, priorities.get(share.device, PRIORITY_LOW))
    off = [r for r, c in per_request.items() if c.enforcement == ENFORCEMENT_OFF]
    if off:
        for gpu in limits(shares):
            if not _whole(gpu, capacity[gpu.device]):
                raise AllocationError(
                    f"ResourceClaim {claim_ref(claim)} asks for enforcement off (request "
                    f"{off[0]}), which is allowed only on a whole GPU, but it holds "
                    f"{gpu.memory_bytes >> 20} MiB of {capacity[gpu.device] >> 20} MiB and "
                    f"{gpu.cores} of {CORES_TOTAL} cores of {gpu.device}"
                )
    return ClaimSettings(priorities, enforced=not off)


def _whole(gpu: GpuLimit, memory_capacity: int) -> bool:
    return gpu.memory_bytes >= memory_capacity and gpu.cores >= CORES_TOTAL
