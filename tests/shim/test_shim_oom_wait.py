"""An allocation the claim has room for waits for memory taken around the shim: when the driver
refuses it with CUDA_ERROR_OUT_OF_MEMORY because a process that does not go through the shim has
taken the GPU's free memory, the shim tries again for up to TESSERA_OOM_WAIT_NS (the node stops
such processes within seconds) before it fails - on every allocation path that charges the claim.
An allocation the claim has no room for, or one on a GPU without a memory limit, fails at once."""

from __future__ import annotations

import subprocess
import time

import pytest

from simgpu.node import read_line, release
from tessera.shim._format import lib
from tessera.shim.format import read_region
from testbed.shim_harness import Claim, ClaimFactory, ClaimProcess, values

MiB = 1 << 20
GPU = 1 << 30  # the simulated GPU's memory
LIMIT = 256 * MiB  # the claim's (make_claim's default)
ASKED = 64 * MiB  # well inside it
APIS = ["mem", "pitch", "managed", "async", "async_ptsz", "pool", "pool_ptsz", "vmm", "array", "array3d"]
WAITING = "memory taken around the shim"
GAVE_UP = "still has no memory free"


def bypasser(claim: Claim, nbytes: int, device: int = 0) -> subprocess.Popen[str]:
    """A process on the claim's node that loads the driver without the shim (as a tenant that
    removes the preload would) and holds ``nbytes`` of CUDA device ``device`` until its stdin
    closes."""
    process = subprocess.Popen(
        [str(claim.programs / "shim_probe"), "alloc", "mem", str(nbytes), "hold"],
        env={**claim.base_env, "PROBE_DEVICE": str(device)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    read_line(process, "HOLD")
    return process


def charges(claim: Claim) -> dict[int, int]:
    """Live processes' charges, by pid, as the exporter reads them."""
    assert claim.region is not None
    return {p.pid: sum(p.used_bytes.values()) for p in read_region(claim.region).processes}


def wait_for_stderr(process: subprocess.Popen[str], text: str) -> str:
    """The first stderr line of ``process`` containing ``text`` (fails if it exits first)."""
    assert process.stderr is not None
    for line in process.stderr:
        if text in line:
            return line
    raise AssertionError(f"process ended without saying {text!r}")


@pytest.mark.parametrize("api", APIS)
def test_an_allocation_waits_until_the_bypasser_frees(
    make_claim: ClaimFactory, simulated_only: None, api: str
) -> None:
    """A process around the shim holds all but 32 MiB of the GPU; a claim process asks for 64 MiB
    (its limit has room) with each allocation API: the shim says it is waiting for memory taken
    around the shim, the bypasser then frees, and the allocation succeeds, charged to the claim."""
    claim = make_claim()
    squeezer = bypasser(claim, GPU - 32 * MiB)
    try:
        waiter = claim.start("shim_probe", "alloc", api, str(ASKED))
        wait_for_stderr(waiter, WAITING)
        release(squeezer)
        out, _ = waiter.communicate(timeout=60)
        assert values(out.splitlines()[0])["rc"] == "0", out
        assert int(values(out.splitlines()[1])["used"]) >= ASKED
    finally:
        squeezer.kill()
        squeezer.wait()


def test_an_allocation_waits_until_the_bypasser_is_killed(
    make_claim: ClaimFactory, simulated_only: None
) -> None:
    """The same when the bypasser is SIGKILLed rather than freeing: the driver gives its memory
    back and the waiting allocation gets it."""
    claim = make_claim()
    squeezer = bypasser(claim, GPU - 32 * MiB)
    try:
        waiter = claim.start("shim_probe", "alloc", "mem", str(ASKED))
        wait_for_stderr(waiter, WAITING)
        squeezer.kill()
        squeezer.wait()
        out, _ = waiter.communicate(timeout=60)
        assert values(out.splitlines()[0])["rc"] == "0", out
    finally:
        squeezer.kill()
        squeezer.wait()


def test_an_allocation_fails_once_the_wait_is_over(make_claim: ClaimFactory, simulated_only: None) -> None:
    """When the bypasser keeps the memory, the allocation fails with CUDA_ERROR_OUT_OF_MEMORY no
    sooner than TESSERA_OOM_WAIT_NS after it was asked for, saying so, and its charge goes back:
    once the bypasser has gone, the same process gets the claim's whole limit."""
    claim = make_claim()
    squeezer = bypasser(claim, GPU - 32 * MiB)
    waiter = ClaimProcess(claim)
    try:
        assert waiter.ask("cuda")["rc"] == "0"
        asked = time.monotonic_ns()
        assert waiter.ask(f"alloc {ASKED}")["rc"] == "2"
        answered = time.monotonic_ns()
        assert answered - asked >= lib.TESSERA_OOM_WAIT_NS
        assert charges(claim) == {waiter.pid: 0}
        release(squeezer)
        assert waiter.ask(f"alloc {LIMIT}")["rc"] == "0"
    finally:
        squeezer.kill()
        squeezer.wait()
        waiter.kill()
    assert waiter.popen.stderr is not None
    said = waiter.popen.stderr.read()
    assert WAITING in said and GAVE_UP in said


def test_refusals_that_are_not_a_squeeze_do_not_wait(make_claim: ClaimFactory, simulated_only: None) -> None:
    """Only an allocation the claim had room for waits: one past the claim's limit is refused by
    the shim itself, and one on a GPU without a memory limit is the driver's answer - both at
    once, with no word of waiting."""
    claim = make_claim(limits=[(0, LIMIT, 0), (1, None, 0)], gpus=2)
    squeezers = [bypasser(claim, GPU - 32 * MiB, device) for device in (0, 1)]
    try:
        past_limit = claim.run("shim_probe", "alloc", "mem", str(LIMIT + MiB))
        assert values(past_limit.stdout)["rc"] == "2"
        assert WAITING not in past_limit.stderr
        unlimited = claim.run("shim_probe", "alloc", "mem", str(ASKED), env={"PROBE_DEVICE": "1"})
        assert values(unlimited.stdout)["rc"] == "2"
        assert WAITING not in unlimited.stderr
    finally:
        for squeezer in squeezers:
            squeezer.kill()
            squeezer.wait()
