"""Requests larger than every GPU or node are refused, judged against the published fleet."""

from __future__ import annotations

import pytest

from tessera.gpu_request import GpuRequest, Refusal
from tessera.quantity import GiB, MiB
from tessera.webhook.fleet import Fleet, fleet_from_slices
from tessera.webhook.validation import check_against_fleet
from tests.unit.webhook.webhook_samples import FLEET


@pytest.mark.parametrize(
    ("request_", "phrase"),
    [
        (
            GpuRequest(1, 81921 * MiB, None, None),
            "nvidia.com/gpumem 81921 (MiB) is more than the largest GPU has (81920 MiB)",
        ),
        (
            GpuRequest(5, 1000 * MiB, None, None),
            "nvidia.com/gpu 5 is more GPUs than any node has (at most 4)",
        ),
        (GpuRequest(5, None, 50, None), "more GPUs than any node has"),
    ],
)
def test_requests_no_gpu_or_node_can_hold_are_refused(request_: GpuRequest, phrase: str) -> None:
    with pytest.raises(Refusal) as refused:
        check_against_fleet('container "main"', request_, FLEET)
    assert str(refused.value).startswith('container "main": ')
    assert phrase in str(refused.value)
    assert str(refused.value).endswith("can never be placed.")


@pytest.mark.parametrize(
    "request_",
    [GpuRequest(4, 81920 * MiB, None, 100), GpuRequest(1, 1 * MiB, None, 1), GpuRequest(4, None, 100, None)],
)
def test_requests_the_largest_gpu_and_node_can_hold_pass(request_: GpuRequest) -> None:
    check_against_fleet("c", request_, FLEET)


def test_nothing_passes_while_no_gpu_is_published() -> None:
    with pytest.raises(Refusal, match=r"no gpu\.tessera\.dev GPU is published"):
        check_against_fleet("c", GpuRequest(1, 1 * MiB, None, None), Fleet())


def gpu_slice(node: str, *sizes: str, driver: str = "gpu.tessera.dev") -> dict[str, object]:
    devices = [
        {"name": f"gpu-{i}", "capacity": {"memory": {"value": size}, "cores": {"value": "100"}}}
        for i, size in enumerate(sizes)
    ]
    return {
        "metadata": {"name": f"{node}-slice"},
        "spec": {"driver": driver, "nodeName": node, "devices": devices},
    }


def test_fleet_counts_sizes_and_gpus_per_node_of_our_driver_only() -> None:
    fleet = fleet_from_slices(
        [
            gpu_slice("a", "80Gi", "80Gi", "40Gi"),
            gpu_slice("b", "85899345920"),
            gpu_slice("c", "1Ti", "1Ti", "1Ti", "1Ti", "1Ti", driver="other.example.com"),
        ]
    )
    assert (fleet.memory_sizes, fleet.max_gpus_per_node) == ((80 * GiB, 40 * GiB), 3)
    assert fleet.products == {"": 4}
    assert fleet.largest_memory == 80 * GiB
