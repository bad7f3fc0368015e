"""What the published GPUs can offer, reduced to the few numbers admission needs.

Built from the watched ResourceSlices (``slices.py`` here watches them, ``tessera/slices.py`` reads
them) and handed to the pure conversion and
validation code as an immutable value, so those stay testable without a cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.slices import published_gpus


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
    """The Fleet that a set of ResourceSlice objects (as JSON) describes. Tainted GPUs count: a
    refusal at admission is final, and an unhealthy GPU may come back (tessera/slices.py)."""
    gpus = published_gpus(slices)
    per_node = Counter(gpu.node for gpu in gpus)
    return Fleet(
        memory_sizes=tuple(sorted({gpu.memory for gpu in gpus}, reverse=True)),
        max_gpus_per_node=max(per_node.values(), default=0),
    )
