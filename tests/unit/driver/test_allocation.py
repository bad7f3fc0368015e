"""A claim's allocation becomes exactly the shares and per-GPU limits the scheduler decided."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.driver.allocation import AllocationError, limits, shares
from tessera.quantity import GiB
from tests.unit.driver.driver_samples import claim, result

DEVICES = ["gpu-a", "gpu-b"]


def test_each_result_of_our_driver_on_our_pool_is_one_share_with_its_consumed_capacity() -> None:
    got = shares(claim(result("gpu-a", "20Gi", "30", share="s1")), "gpu.tessera.dev", "node-a", DEVICES)
    assert len(got) == 1
    assert (got[0].device, got[0].share_id, got[0].memory_bytes, got[0].cores) == (
        "gpu-a",
        "s1",
        20 * GiB,
        30,
    )


def test_subrequest_names_are_reduced_to_the_request_the_kubelet_matches() -> None:
    got = shares(claim(result("gpu-a", "1Gi", "0", request="gpu/h100")), "gpu.tessera.dev", "node-a", DEVICES)
    assert got[0].request == "gpu"


def test_results_of_other_drivers_are_not_ours_to_prepare() -> None:
    other = {**result("nic-0", "0", "0"), "driver": "net.example.com"}
    got = shares(claim(other, result("gpu-b", "1Gi", "5")), "gpu.tessera.dev", "node-a", DEVICES)
    assert [s.device for s in got] == ["gpu-b"]


def test_two_shares_of_one_gpu_add_up_and_cores_never_pass_the_whole_gpu() -> None:
    two = claim(result("gpu-a", "20Gi", "30", share="s1"), result("gpu-a", "10Gi", "80", share="s2"))
    got = limits(shares(two, "gpu.tessera.dev", "node-a", DEVICES))
    assert [(g.device, g.memory_bytes, g.cores) for g in got] == [("gpu-a", 30 * GiB, 100)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (claim(allocated=False), "ResourceClaim ns/c1 is not allocated yet"),
        (claim(result("gpu-z", "1Gi", "1")), "was allocated device gpu-z, which this node does not have"),
        (claim({**result("gpu-a", "1Gi", "1"), "pool": "node-b"}), "which is not this node's pool node-a"),
        (claim({**result("gpu-a", "1Gi", "1"), "consumedCapacity": None}), "DRAConsumableCapacity"),
        (
            claim({**result("gpu-a", "1Gi", "1"), "driver": "other"}),
            "has no device of driver gpu.tessera.dev",
        ),
        (claim(result("gpu-a", "1.5", "1")), "is not a whole number"),
    ],
    ids=[
        "unallocated",
        "unknown-device",
        "foreign-pool",
        "no-consumed-capacity",
        "no-result-of-ours",
        "fraction",
    ],
)
def test_a_claim_that_cannot_be_prepared_is_refused_in_one_sentence_naming_it(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(AllocationError) as refused:
        shares(body, "gpu.tessera.dev", "node-a", DEVICES)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
