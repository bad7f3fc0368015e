"""Compute caps: a claim's kernels, graphs and cooperative launches take its `cores` share of
the GPU's time, over one or several processes, next to another capped claim. (The full table of
caps x kernel lengths x processes is benchmarks/shim/compute_accuracy.py.)

A share is GPU time over the workload's wall time, so a busy machine can lower it (a workload
waiting for a CPU launches nothing) but never raise it. So each share must be at most 3 points
above its cap, whatever the load, and at most 3 points below it plus the share of its wall time
the workload spent runnable but waiting for a CPU (its run delay, from the kernel's schedstat):
only then can it lose GPU time. On an idle machine that delay is a fraction of a point."""

from __future__ import annotations

import subprocess

import pytest

from testbed.shim_harness import Claim, ClaimFactory, Share, share_of, values

# Shares of time are measured: no other test may share the CPUs (tests/conftest.py).
pytestmark = pytest.mark.alone

TOLERANCE = 3.0  # percentage points


def duty(claims: list[Claim], kernel_ns: int, seconds: float, how: str = "kernel") -> list[Share]:
    """Run one duty-cycle worker per claim entry at once; what each achieved."""
    procs = [c.start("shim_probe", "duty", str(kernel_ns), str(seconds), "4", how) for c in claims]
    shares = []
    for p in procs:
        out, err = p.communicate(timeout=seconds + 60)
        assert p.returncode == 0, err
        shares.append(share_of(out))
    return shares


def test_single_process_cap(make_claim: ClaimFactory) -> None:
    """One process of a claim capped at 30 % gets 30 % (within 3 points) of the GPU."""
    claim = make_claim(limits=[(0, None, 30)])
    (share,) = duty([claim], 2_000_000, 2.0)
    assert share.near(30, TOLERANCE), share


def test_two_claims_30_and_60(make_claim: ClaimFactory) -> None:
    """Two claims capped at 30 and 60 on one GPU get 30 and 60."""
    a = make_claim(limits=[(0, None, 30)], name="a")
    b = make_claim(limits=[(0, None, 60)], name="b")
    share_a, share_b = duty([a, b], 2_000_000, 3.0)
    assert share_a.near(30, TOLERANCE) and share_b.near(60, TOLERANCE), (share_a, share_b)


def test_processes_share_one_cap(make_claim: ClaimFactory) -> None:
    """Four processes of one claim capped at 40 % together get 40 %. (The claim loses GPU time
    only while none of them can launch, so the most any one of them waited for a CPU bounds
    what the machine's load took from the claim.)"""
    claim = make_claim(limits=[(0, None, 40)])
    shares = duty([claim] * 4, 1_000_000, 3.0)
    together = Share(sum(s.achieved for s in shares), max(s.waited for s in shares))
    assert together.near(40, TOLERANCE), shares


@pytest.mark.parametrize("how", ["graph", "coop", "ex"])
def test_graphs_cooperative_and_ex_launches_are_capped(make_claim: ClaimFactory, how: str) -> None:
    """CUDA graph launches, cooperative launches and cuLaunchKernelEx are capped like kernels."""
    claim = make_claim(limits=[(0, None, 50)])
    (share,) = duty([claim], 1_000_000, 1.5, how)
    assert share.near(50, TOLERANCE), share


def test_graph_of_kernel_nodes_launched_thousands_of_times_is_capped(make_claim: ClaimFactory) -> None:
    """A graph of four kernel nodes (100 us each) launched over and over for 4 s under a 30 %
    cap - some three thousand launches at the cap - holds the cap within the same bound as plain
    kernel launches (TOLERANCE, plus what the machine's load took from the worker)."""
    claim = make_claim(limits=[(0, None, 30)])
    proc = claim.start("shim_probe", "duty", "400000", "4.0", "4", "graph4")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    share = share_of(out)
    assert share.near(30, TOLERANCE), out
    assert claim.region is not None
    from tessera.shim.format import read_region

    assert read_region(claim.region).gpus[0].launches == int(values(out)["launched"]), out


def test_launches_into_a_capturing_stream_are_not_paced(make_claim: ClaimFactory) -> None:
    """Launches into a capturing stream are recorded into a graph, not run, so the controller
    neither gates nor charges them: of 200 captured and N plain launches the region counts the
    N. Once the capture has ended the process's launches ask the driver whether their stream is
    capturing and, not capturing, are capped as before. The capture calls pass through."""
    from tessera.shim.format import read_region

    claim = make_claim(limits=[(0, None, 50)])
    proc = claim.start("shim_probe", "duty", "1000000", "1.5", "4", "capture")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert values(out)["begin_capture_rc"] == "0"
    assert claim.region is not None
    assert read_region(claim.region).gpus[0].launches == int(values(out)["launched"]), out
    assert share_of(out).near(50, TOLERANCE), out


def test_uncapped_claim_is_not_paced(make_claim: ClaimFactory) -> None:
    """A claim with only a memory limit (cores 0) runs its kernels back to back, like no shim."""
    claim = make_claim(limits=[(0, 1 << 28, 0)])
    (share,) = duty([claim], 2_000_000, 1.0)
    assert share.achieved >= 95 - share.waited, share


def test_region_records_compute(make_claim: ClaimFactory) -> None:
    """The usage region shows the GPU time charged and the launches paced, for the exporter."""
    from tessera.shim.format import read_region

    claim = make_claim(limits=[(0, None, 50)])
    duty([claim], 1_000_000, 0.5)
    assert claim.region is not None
    gpu = read_region(claim.region).gpus[0]
    assert gpu.launches > 0 and gpu.charged_ns > 0 and gpu.throttled_ns > 0


def test_probe_runs_without_shim(make_claim: ClaimFactory) -> None:
    """The duty workload itself keeps the simulated GPU busy when nothing limits it (sanity)."""
    claim = make_claim(limits=[])
    done = subprocess.run(
        [str(claim.programs / "shim_probe"), "duty", "2000000", "0.5", "4"],
        env=dict(claim.base_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    share = share_of(done.stdout)
    assert share.achieved >= 95 - share.waited, share


FAILING_LAUNCHES = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
ctx, mod, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
assert cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"simgpu_sleep_ns") == 0
ns = ctypes.c_uint64(1000000)
params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
rcs = {cuda.cuLaunchCooperativeKernel(fn, 1 << 30, 1, 1, 1, 1, 1, 0, None, params) for _ in range(40)}
print("rcs", sorted(rcs))
"""


def test_failed_launches_are_refunded(make_claim: ClaimFactory) -> None:
    """A capped launch the driver refuses (here a cooperative launch too large for the GPU) is
    refunded and leaves its shape's ledger: 40 of them at a 10 % cap neither wait for budget
    (each would otherwise cost 100 ms of waiting) nor leave anything charged. Whether a launch
    waited is the shim's own counter (the region's throttled_ns, the time launches spent
    waiting for budget), not a stopwatch, so a busy machine cannot fake or hide it."""
    from tessera.shim.format import read_region

    claim = make_claim(limits=[(0, None, 10)])
    done = claim.python(FAILING_LAUNCHES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["rcs", "[720]"], done.stdout  # COOPERATIVE_LAUNCH_TOO_LARGE
    assert claim.region is not None
    gpu = read_region(claim.region).gpus[0]
    assert (gpu.launches, gpu.charged_ns, gpu.throttled_ns) == (40, 0, 0), gpu
