"""Memory shared between processes and the patterns frameworks build on it, under limits: an
NCCL-like ring exchanging IPC handles and exported VMM handles (within one claim and across
claims), vLLM's sleep mode, and one process driving two GPUs with peer access and copies. Memory
is charged once, to the claim that allocated it; opening, mapping or closing an import neither
charges nor refunds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from simgpu.node import read_line
from tessera.shim.format import read_region
from testbed.shim_harness import Claim, ClaimFactory, prefixed, values

MiB = 1 << 20
BUF = 32 * MiB  # each rank's cuMemAlloc buffer
VMM = 2 * MiB  # each rank's exported VMM allocation (the simulator's granularity)
OWN = BUF + VMM


def used_per_gpu(claim: Claim) -> dict[str, int]:
    assert claim.region is not None
    return {g.uuid: g.used_bytes for g in read_region(claim.region).gpus}


def run_ring(claims: list[Claim], sockets: Path) -> tuple[list[subprocess.Popen[str]], list[dict[str, str]]]:
    """Start rank i under claims[i] and wait until every rank has opened its neighbour's memory."""
    n = len(claims)
    ranks = [
        c.start("shim_share", "ring", str(n), str(i), str(BUF), str(sockets)) for i, c in enumerate(claims)
    ]
    opened = []
    for r in ranks:
        first = read_line(r, "rank=")
        second = read_line(r, "opened")
        opened.append(values(first + " " + second.replace("opened ", "")))
    return ranks, opened


def finish_ring(ranks: list[subprocess.Popen[str]]) -> list[str]:
    for r in ranks:
        assert r.stdin is not None
        r.stdin.write("go\n")
        r.stdin.flush()
    outs = []
    for r in ranks:
        out, err = r.communicate(timeout=60)
        assert r.returncode == 0, err
        outs.append(out)
    return outs


@pytest.mark.parametrize("n", [2, 8])
def test_ring_in_one_claim_charges_each_rank_its_own(
    make_claim: ClaimFactory, tmp_path: Path, n: int
) -> None:
    """N ranks of one claim, one GPU each, limited to a little more than one rank's own memory:
    every rank reads its neighbour's writes through both handles, and each GPU's usage is its
    own rank's allocations - opening the neighbour's charged nothing (it would not have fit) -
    unchanged by closing the imports, and 0 once each rank freed its own."""
    limit = OWN + 4 * MiB
    claim = make_claim(limits=[(i, limit, 0) for i in range(n)], gpus=n)
    ranks, opened = run_ring([claim] * n, tmp_path)
    try:
        assert [o["ring_ok"] for o in opened] == ["1"] * n
        assert [int(o["used"]) for o in opened] == [OWN] * n
        assert sorted(used_per_gpu(claim).values()) == [OWN] * n
    finally:
        outs = finish_ring(ranks)
    for out in outs:
        assert int(prefixed(out, "closed")["used"]) == OWN  # the importer's close refunded nothing
    assert sorted(used_per_gpu(claim).values()) == [0] * n


def test_ring_on_one_gpu_charges_each_rank_its_own(make_claim: ClaimFactory, tmp_path: Path) -> None:
    """Four ranks of one claim on one GPU (the common single-GPU case, and what a one-GPU
    machine runs): the GPU holds exactly the four ranks' own memory while they have each
    other's open."""
    claim = make_claim(limits=[(0, 4 * OWN + 4 * MiB, 0)])
    ranks, opened = run_ring([claim] * 4, tmp_path)
    try:
        assert [o["ring_ok"] for o in opened] == ["1"] * 4
        assert list(used_per_gpu(claim).values()) == [4 * OWN]
    finally:
        finish_ring(ranks)
    assert list(used_per_gpu(claim).values()) == [0]


def test_ring_across_claims_charges_the_allocating_claim(make_claim: ClaimFactory, tmp_path: Path) -> None:
    """Four ranks on one node, alternating between two claims (each rank's neighbours are the
    other claim's): each claim holds exactly its own two ranks' memory, none of what it opened."""
    a = make_claim(limits=[(0, OWN, 0), (2, OWN, 0)], gpus=4, name="a", node="shared")
    b = make_claim(limits=[(1, OWN, 0), (3, OWN, 0)], gpus=4, name="b", node="shared")
    ranks, opened = run_ring([a, b, a, b], tmp_path)
    try:
        assert [o["ring_ok"] for o in opened] == ["1"] * 4
        assert sorted(used_per_gpu(a).values()) == [OWN, OWN]
        assert sorted(used_per_gpu(b).values()) == [OWN, OWN]
    finally:
        finish_ring(ranks)
    assert sum(used_per_gpu(a).values()) == sum(used_per_gpu(b).values()) == 0


def test_sleep_mode_releases_and_recreates_at_the_same_addresses(make_claim: ClaimFactory) -> None:
    """vLLM's sleep mode with a limit of exactly its weights (4 x 2 MiB of VMM memory): asleep,
    the claim holds nothing and the whole limit can be allocated by someone else, while that is
    held waking is refused; 100 sleep/wake cycles at the same addresses keep the data and the
    charge exact."""
    weights = 8 * MiB
    claim = make_claim(limits=[(0, weights, 0)])
    done = claim.run("shim_share", "sleep", "4", str(2 * MiB), "100", "probe", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert int(prefixed(out, "awake")["used"]) == weights
    assert int(prefixed(out, "asleep")["used"]) == 0
    v = values(out)
    assert v["asleep_alloc_rc"] == "0"
    assert v["wake_while_held_rc"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert v["data_ok"] == "1" and v["cycles"] == "100"
    assert int(prefixed(out, "cycles")["used"]) == weights
    assert int(prefixed(out, "end")["used"]) == 0


def test_one_process_two_gpus_each_limited_by_its_own_entry(make_claim: ClaimFactory) -> None:
    """A context per device, peer access both ways and peer copies: device 0 allocates up to its
    64 MiB, device 1 up to its 128 MiB (refused past them with CUDA_ERROR_OUT_OF_MEMORY), each
    cuMemGetInfo shows its own limit and usage, and the copies move the bytes."""
    claim = make_claim(limits=[(0, 64 * MiB, 0), (1, 128 * MiB, 0)], gpus=2)
    done = claim.run("shim_share", "multigpu", str(512 * MiB), str(512 * MiB))
    assert done.returncode == 0, done.stdout + done.stderr
    v = values(done.stdout)
    assert v["can_access_peer"] == "1,1"
    assert v["enable_twice_rc"] == "704"  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    assert v["disable_unenabled_rc"] == "705"  # CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
    assert (int(v["max0"]), v["refusal0"]) == (64 * MiB, "2")
    assert (int(v["max1"]), v["refusal1"]) == (128 * MiB, "2")
    assert (int(v["total0"]), int(v["total1"])) == (64 * MiB, 128 * MiB)
    assert v["peer_copy_ok"] == v["peer_copy_async_ok"] == "1"
    assert int(v["used0"]) == int(v["used1"]) == 4 * MiB
    assert sum(used_per_gpu(claim).values()) == 0
