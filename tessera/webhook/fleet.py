"""What the published GPUs can offer, reduced to the few numbers admission needs.

Built from the watched ResourceSlices (``slices.py``) and handed to the pure conversion and
validation code as an immutable value, so those stay testable without a cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.names import DRIVER_NAME, MEMORY_CAPACITY
from tessera.quantity import quantity_to_int


@dataclass(frozen=True)
class Fleet:
    """The GPUs the driver publishes: their distinct memory sizes, largest first, and the most GPUs
    any one node has. ``synced`` is False until the first list of slices arrived."""

    memory_sizes: tuple[int, ...] = ()
    max_gpus_per_node: int = 0
    synced: bool = True

    @property
    def largest_memory(self) -> int:
        return self.memory_sizes[0] if self.memory_sizes else 0


def fleet_from_slices(slices: Iterable[Mapping[str, Any]]) -> Fleet:
    """The Fleet that a set of ResourceSlice objects (as JSON) describes; slices of other drivers and
    devices without a memory capacity are ignored."""
    sizes: set[int] = set()
    per_node: Counter[str] = Counter()
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        node = spec.get("nodeName") or (spec.get("pool") or {}).get("name") or ""
        for device in spec.get("devices") or []:
            capacity = (device.get("capacity") or {}).get(MEMORY_CAPACITY)
            if not capacity or "value" not in capacity:
                continue
            try:
                sizes.add(quantity_to_int(capacity["value"]))
            except ValueError:
                continue
            per_node[node] += 1
    return Fleet(
        memory_sizes=tuple(sorted(sizes, reverse=True)),
        max_gpus_per_node=max(per_node.values(), default=0),
    )
