"""Graph memory: an executable graph is charged, when instantiated, a bound of what its
allocation nodes can take (each rounded up to 2 MiB); one that does not fit is refused with
CUDA_ERROR_OUT_OF_MEMORY before the driver is asked. When the executable is destroyed its bound
goes and what the driver still reserves for graphs stays charged, until cuDeviceGraphMemTrim
gives it back. Nodes added directly, through cuGraphAddNode and captured from stream-ordered
allocations are charged alike."""

from __future__ import annotations

import pytest

from tessera.shim.format import read_region
from testbed.shim_harness import Claim, ClaimFactory, prefixed, values

MiB = 1 << 20
HOWS = ["node", "addnode", "capture", "capture_ptsz", "pool"]


def region_used(claim: Claim) -> int:
    """What the claim's region says its live processes use."""
    assert claim.region is not None
    return sum(g.used_bytes for g in read_region(claim.region).gpus)


def used(output: str, step: str) -> int:
    """The memory the process was charged, as cuMemGetInfo showed it at `step`."""
    return int(prefixed(output, f"{step}: ")["used"])


@pytest.mark.parametrize("how", HOWS)
def test_graph_that_fits_is_charged_its_bound_until_destroyed_and_trimmed(
    make_claim: ClaimFactory, how: str
) -> None:
    """A graph allocating 63 MiB under a 256 MiB limit: nothing is charged while it is built
    (captured allocations included), 64 MiB (the bound, in 2 MiB granules) from its
    instantiation, through its launch; once its executable is destroyed, what the driver keeps
    cached for graphs (the 63 MiB it launched with) stays charged, and cuDeviceGraphMemTrim
    gives it all back."""
    claim = make_claim()
    done = claim.run("shim_probe", "graph_mem", how, str(63 * MiB))
    assert done.returncode == 0, done.stderr
    if how.startswith("capture") or how == "pool":
        assert used(done.stdout, "captured") == 0
    assert used(done.stdout, "built") == 0
    assert values(done.stdout)["instantiate_rc"] == "0"
    assert used(done.stdout, "instantiated") == 64 * MiB
    assert used(done.stdout, "launched") == 64 * MiB
    assert used(done.stdout, "destroyed") == 63 * MiB
    assert used(done.stdout, "trimmed") == 0
    assert region_used(claim) == 0


@pytest.mark.parametrize("how", ["node", "capture"])
def test_graph_past_the_limit_is_refused_at_instantiation(make_claim: ClaimFactory, how: str) -> None:
    """A graph allocating 300 MiB under a 256 MiB limit builds (its nodes are addresses only),
    but its instantiation is CUDA_ERROR_OUT_OF_MEMORY, charges nothing and says why."""
    claim = make_claim()
    done = claim.run("shim_probe", "graph_mem", how, str(300 * MiB))
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["instantiate_rc"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert used(done.stdout, "destroyed") == 0
    assert "graph instantiation refused" in done.stderr
    assert region_used(claim) == 0


def test_cached_graph_memory_is_trimmed_to_make_room_for_an_instantiation(
    make_claim: ClaimFactory,
) -> None:
    """After a 160 MiB graph ran and its executable was destroyed, the driver still caches its
    memory and the claim is charged for it; a second 160 MiB graph would not fit beside it, so
    the shim trims the graph memory cache and the instantiation succeeds."""
    claim = make_claim()
    done = claim.run("shim_probe", "graph_mem", "node", str(160 * MiB), "again")
    assert done.returncode == 0, done.stderr
    assert used(done.stdout, "destroyed") == 160 * MiB
    assert values(done.stdout)["second_instantiate_rc"] == "0"
    assert used(done.stdout, "second_instantiated") == 160 * MiB
    assert used(done.stdout, "second_destroyed") == 160 * MiB
    assert used(done.stdout, "trimmed") == 0
    assert region_used(claim) == 0


def test_graph_memory_passes_through_without_memory_limit(
    make_claim: ClaimFactory, simulated_only: None
) -> None:
    """Without a memory limit (a cores-only claim) graphs with memory nodes are instantiated
    whatever they allocate, nothing is refused or charged."""
    claim = make_claim(limits=[(0, None, 50)])
    done = claim.run("shim_probe", "graph_mem", "capture", str(300 * MiB))
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["instantiate_rc"] == "0"
    assert "refused" not in done.stderr


def test_instantiation_the_driver_refuses_charges_nothing(make_claim: ClaimFactory) -> None:
    """A graph with memory nodes has one executable at a time: instantiating it again while the
    first exists is the driver's CUDA_ERROR_INVALID_VALUE, and the charge made for it beforehand
    is given back (the claim still holds only the first executable's bound)."""
    claim = make_claim()
    done = claim.run("shim_probe", "graph_mem", "node", str(64 * MiB), "twice")
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["twice_rc"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert used(done.stdout, "twice") == 64 * MiB
    assert used(done.stdout, "trimmed") == 0
    assert region_used(claim) == 0


def test_graph_with_memory_on_two_devices_is_refused(make_claim: ClaimFactory) -> None:
    """One executable's memory is charged on one device: a graph allocating on two devices is
    refused at instantiation with CUDA_ERROR_NOT_SUPPORTED, charging nothing, and says why."""
    claim = make_claim(limits=[(0, 256 * MiB, 0), (1, 256 * MiB, 0)], gpus=2)
    done = claim.run("shim_probe", "graph_mem", "two_devices", str(8 * MiB))
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["instantiate_rc"] == "801"  # CUDA_ERROR_NOT_SUPPORTED
    assert "graph with memory on CUDA devices 0 and 1 refused" in done.stderr
    assert region_used(claim) == 0


def test_cached_graph_memory_is_trimmed_to_make_room_for_an_allocation(
    make_claim: ClaimFactory,
) -> None:
    """The claim holds 160 MiB for what the driver caches of a destroyed graph; a 160 MiB
    cuMemAlloc would not fit beside it under the 256 MiB limit, so the shim trims the graph
    memory cache (after the pool caches) and the allocation is made, charged alone."""
    claim = make_claim()
    done = claim.run("shim_probe", "graph_mem", "node", str(160 * MiB), "alloc")
    assert done.returncode == 0, done.stderr
    assert used(done.stdout, "destroyed") == 160 * MiB
    assert values(done.stdout)["alloc_rc"] == "0"
    assert used(done.stdout, "allocated") == 160 * MiB
    assert used(done.stdout, "trimmed") == 0
    assert region_used(claim) == 0
