"""Refuse what can never be placed, judged against the GPUs the driver publishes.

The value rules that need no cluster (whole numbers, ranges, gpumem with a percentage) live in
``tessera.gpu_request.read_request``; here are the two that need the fleet: a per-GPU memory larger than the
largest GPU, and more GPUs than any one node has. A pod refused here would otherwise sit Pending
forever with a scheduler message that does not name the container.
"""

from __future__ import annotations

from tessera.gpu_request import GpuRequest, Refusal
from tessera.names import DEVICE_CLASS, HAMI_GPU, HAMI_GPUMEM
from tessera.quantity import MiB
from tessera.webhook.fleet import Fleet


def check_against_fleet(where: str, request: GpuRequest, fleet: Fleet) -> None:
    """Raise Refusal when ``request`` exceeds every node or every GPU that ``fleet`` describes."""
    if not fleet.memory_sizes:
        raise Refusal(
            f"{where}: no {DEVICE_CLASS} GPU is published in the cluster, so {HAMI_GPU} cannot be met."
        )
    if request.memory is not None and request.memory > fleet.largest_memory:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM} {request.memory // MiB} (MiB) is more than the largest GPU has "
            f"({fleet.largest_memory // MiB} MiB), so it can never be placed."
        )
    if request.count > fleet.max_gpus_per_node:
        raise Refusal(
            f"{where}: {HAMI_GPU} {request.count} is more GPUs than any node has "
            f"(at most {fleet.max_gpus_per_node}), so it can never be placed."
        )
