"""What the published GPUs can offer, reduced to what admission needs.

Built from the watched ResourceSlices (``slices.py`` here watches them, ``tessera/slices.py`` reads
them) and handed to the pure conversion and validation code as an immutable value, so those stay
testable without a cluster. Everything a review asks of it is precomputed here, on a slice change,
so a review's questions cost what its own annotations and resources name, never the fleet's size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.gpu_request import Selection
from tessera.names import DEVICE_TYPE_ATTRIBUTE, DRIVER_NAME, MIG_PROFILE_ATTRIBUTE
from tessera.slices import published_gpus

MIG_TYPE = "mig"
"""The ``type`` attribute of a published MIG instance (the contract with the driver)."""


@dataclass(frozen=True)
class Fleet:
    """The GPUs the driver publishes for sharing: their distinct memory sizes, largest first, the
    most GPUs any one node has, how many GPUs of each product name there are and the product of
    each UUID; and the MIG profiles published. ``synced`` is False until the first list of slices
    arrived. Two fleets compare equal by the numbers that decide refusals; the names, which only
    shape warnings, are left out (they are derived from the same slices)."""

    memory_sizes: tuple[int, ...] = ()
    max_gpus_per_node: int = 0
    synced: bool = True
    products: Mapping[str, int] = field(default_factory=dict, compare=False)
    uuid_products: Mapping[str, str] = field(default_factory=dict, compare=False)
    uuids: tuple[str, ...] = field(default=(), compare=False)
    """The keys of ``uuid_products``, sorted once here: a warning names the first few."""
    mig_profiles: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def largest_memory(self) -> int:
        return self.memory_sizes[0] if self.memory_sizes else 0

    def has_match(self, selection: Selection) -> bool:
        """Whether any published GPU passes ``selection``. Costs the entries of the selection and
        the distinct product names, whatever the number of GPUs."""
        if selection.use_uuids is not None:
            return any(
                uuid in self.uuid_products and selection.matches(uuid, self.uuid_products[uuid])
                for uuid in selection.use_uuids
            )
        excluded = Counter(
            self.uuid_products[uuid] for uuid in selection.nouse_uuids or () if uuid in self.uuid_products
        )
        return any(
            count > excluded[product]
            and Selection(None, None, selection.use_types, selection.nouse_types).matches("", product)
            for product, count in self.products.items()
        )


def _is_mig(device: Mapping[str, Any]) -> bool:
    attribute = ((device.get("attributes") or {}).get(DEVICE_TYPE_ATTRIBUTE)) or {}
    return isinstance(attribute, Mapping) and attribute.get("string") == MIG_TYPE


def _split(slices: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], set[str]]:
    """Our slices with their MIG instances left out (a GPU in MIG mode is not shareable), and the
    profiles of those instances."""
    shares: list[Mapping[str, Any]] = []
    profiles: set[str] = set()
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        devices = [device for device in spec.get("devices") or [] if isinstance(device, Mapping)]
        for device in devices:
            if _is_mig(device):
                profile = ((device.get("attributes") or {}).get(MIG_PROFILE_ATTRIBUTE) or {}).get("string")
                if isinstance(profile, str):
                    profiles.add(profile)
        shares.append({**item, "spec": {**spec, "devices": [d for d in devices if not _is_mig(d)]}})
    return shares, profiles


def fleet_from_slices(slices: Iterable[Mapping[str, Any]]) -> Fleet:
    """The Fleet that a set of ResourceSlice objects (as JSON) describes. Tainted GPUs count: a
    refusal at admission is final, and an unhealthy GPU may come back (tessera/slices.py)."""
    shares, profiles = _split(slices)
    gpus = published_gpus(shares)
    per_node = Counter(gpu.node for gpu in gpus)
    return Fleet(
        memory_sizes=tuple(sorted({gpu.memory for gpu in gpus}, reverse=True)),
        max_gpus_per_node=max(per_node.values(), default=0),
        products=dict(Counter(gpu.product for gpu in gpus)),
        uuid_products={gpu.uuid: gpu.product for gpu in gpus if gpu.uuid},
        uuids=tuple(sorted({gpu.uuid for gpu in gpus if gpu.uuid})),
        mig_profiles=frozenset(profiles),
    )
