"""Slot ownership: a process's charge stays counted in the claim's usage region for as long as it
lives, whatever else it does with the region - its NVML half sweeping for dead processes every
0.1 s, another descriptor of the region file opened and closed (a tool reading it), a fork - and
goes back when it dies, even while a child it forked lives on. Checked with the shim's own test
program and with NVIDIA's Python clients (nvidia-ml-py, cuda-bindings), which nobody here wrote."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import textwrap

from simgpu.config import GiB
from simgpu.node import read_line
from tessera.shim.format import read_region
from testbed.shim_harness import Claim, ClaimFactory, ClaimProcess, values

LIMIT = 8 * GiB
HELD = 5 * GiB
OOM = "2"  # CUDA_ERROR_OUT_OF_MEMORY
# NVML sweeps at a memory-info call once the last sweep is 0.1 s old: readings this far apart
# each sweep.
GAP_MS = 150
READINGS = f"nvml 3 {GAP_MS}"


def big_claim(make_claim: ClaimFactory) -> Claim:
    """An 8 GiB claim on a 16 GiB GPU: the driver itself never refuses what the tests take."""
    return make_claim(limits=[(0, LIMIT, 0)], memory_bytes=16 * GiB)


def charges(claim: Claim) -> dict[int, int]:
    """Live processes' charges, by pid, as the exporter reads them (no sweep)."""
    assert claim.region is not None
    return {p.pid: sum(p.used_bytes.values()) for p in read_region(claim.region).processes}


def test_nvml_readings_leave_the_callers_own_memory_counted(make_claim: ClaimFactory) -> None:
    """A process holding 5 GiB of an 8 GiB claim reads NVML memory info (v1 and v2) three times,
    0.15 s apart (each reading sweeps for dead processes): every reading says 5 GiB used, the
    whole 8 GiB is then refused with CUDA_ERROR_OUT_OF_MEMORY and the 3 GiB left still fit."""
    claim = big_claim(make_claim)
    holder = ClaimProcess(claim).holding(HELD)
    try:
        assert holder.nvml_used(READINGS) == [HELD] * 6
        assert charges(claim) == {holder.pid: HELD}
        assert holder.ask(f"alloc {LIMIT}")["rc"] == OOM
        assert holder.ask(f"alloc {LIMIT - HELD}")["rc"] == "0"
    finally:
        holder.kill()


def test_nvml_readings_in_one_process_leave_its_memory_counted_for_the_others(
    make_claim: ClaimFactory,
) -> None:
    """While one process of the claim holds 5 GiB and reads NVML memory info 0.15 s apart, another
    process of the claim is refused the whole 8 GiB (its failed reservation sweeps too) and gets
    the 3 GiB left."""
    claim = big_claim(make_claim)
    holder = ClaimProcess(claim).holding(HELD)
    other = ClaimProcess(claim)
    try:
        assert holder.nvml_used(READINGS) == [HELD] * 6
        assert other.ask("cuda")["rc"] == "0"
        assert other.ask(f"alloc {LIMIT}")["rc"] == OOM
        assert other.ask(f"alloc {LIMIT - HELD}")["rc"] == "0"
        assert charges(claim) == {holder.pid: HELD, other.pid: LIMIT - HELD}
    finally:
        holder.kill()
        other.kill()


def test_closing_another_descriptor_of_the_region_keeps_the_slot(make_claim: ClaimFactory) -> None:
    """A process holding 5 GiB opens the region file and closes it again (as a tool that reads
    the usage would): its slot stays its own - the exporter still sees it live, another process's
    sweep leaves it, and that process is refused the whole limit."""
    claim = big_claim(make_claim)
    holder = ClaimProcess(claim).holding(HELD)
    other = ClaimProcess(claim)
    try:
        assert holder.ask("touch")["rc"] == "0"
        assert charges(claim) == {holder.pid: HELD}
        assert other.ask("cuda")["rc"] == "0"
        assert other.ask(f"alloc {LIMIT}")["rc"] == OOM
        assert holder.nvml_used(READINGS) == [HELD] * 6
    finally:
        holder.kill()
        other.kill()


def test_a_process_that_closes_the_shims_descriptors_sweeps_no_live_slot(
    make_claim: ClaimFactory,
) -> None:
    """A process closes every descriptor of the region, the shim's own included (as a daemon
    that closes all does), and its next files take the same numbers: its slot stays its own (the
    mapping keeps the lock), and its sweeps - NVML readings 0.15 s apart, an allocation refused
    for want of room - free no other process's live slot, though every lock on the files now
    behind those numbers would succeed."""
    claim = big_claim(make_claim)
    holder = ClaimProcess(claim).holding(HELD)
    closer = ClaimProcess(claim).holding(GiB)
    try:
        assert closer.nvml_used("nvml 1 0") == [HELD + GiB] * 2  # its NVML half has the file open
        assert closer.ask("reuse")["closed"] == "2"
        assert closer.nvml_used(READINGS) == [HELD + GiB] * 6
        assert closer.ask(f"alloc {LIMIT}")["rc"] == OOM
        assert charges(claim) == {holder.pid: HELD, closer.pid: GiB}
        assert closer.ask(f"alloc {LIMIT - HELD - GiB}")["rc"] == "0"
    finally:
        holder.kill()
        closer.kill()


def test_forked_processes_each_own_a_slot(make_claim: ClaimFactory) -> None:
    """A process whose shim is initialised (entry points resolved, no cuInit yet, as a binding
    does at import) forks; child and parent then each start CUDA and allocate: each has a slot
    of its own with its own charge, both see the claim's 3 GiB through NVML readings 0.15 s apart,
    and what they hold together is enforced (6 GiB more refused, 5 GiB granted)."""
    claim = big_claim(make_claim)
    parent = ClaimProcess(claim)
    try:
        assert parent.ask("procaddr")["rc"] == "0"
        assert parent.ask("nvml 1 0")["used"] == "0"
        child = int(parent.ask("fork")["pid"])
        assert parent.ask("child cuda")["rc"] == "0"
        assert parent.ask(f"child alloc {GiB}")["rc"] == "0"
        assert parent.ask("cuda")["rc"] == "0"
        assert parent.ask(f"alloc {2 * GiB}")["rc"] == "0"
        assert charges(claim) == {parent.pid: 2 * GiB, child: GiB}
        assert parent.nvml_used(f"child nvml 2 {GAP_MS}") == [3 * GiB] * 4
        assert parent.nvml_used(f"nvml 2 {GAP_MS}") == [3 * GiB] * 4
        assert parent.ask(f"alloc {6 * GiB}")["rc"] == OOM
        assert parent.ask(f"child alloc {6 * GiB}")["rc"] == OOM
        assert parent.ask(f"alloc {5 * GiB}")["rc"] == "0"
        assert charges(claim) == {parent.pid: 7 * GiB, child: GiB}
    finally:
        parent.kill()


def test_a_child_that_cannot_open_the_region_again_takes_no_memory(make_claim: ClaimFactory) -> None:
    """A child forked with no descriptor free cannot open a description of the region of its own;
    sharing its parent's, it could take its parent's slot, so it takes none: its allocation is
    refused (with a message saying why), while NVML still shows it the claim's usage and the
    parent's slot and charge stay the parent's."""
    claim = big_claim(make_claim)
    parent = ClaimProcess(claim)
    try:
        assert parent.ask("procaddr")["rc"] == "0"
        child = int(parent.ask("fork starved")["pid"])
        assert parent.ask("cuda")["rc"] == "0"
        assert parent.ask(f"alloc {HELD}")["rc"] == "0"
        assert parent.ask("child cuda")["rc"] == "0"
        assert parent.ask(f"child alloc {GiB}")["rc"] == OOM
        assert parent.nvml_used(f"child nvml 2 {GAP_MS}") == [HELD] * 4
        assert charges(claim) == {parent.pid: HELD}
        assert child not in charges(claim)
    finally:
        parent.kill()
    assert parent.popen.stderr is not None
    assert "the usage region's descriptor is gone" in parent.popen.stderr.read()


def test_a_dead_parent_gives_its_memory_back_while_its_child_lives(make_claim: ClaimFactory) -> None:
    """A process holding 5 GiB forks a child (which reads NVML, as a data-loading worker might)
    and is SIGKILLed: the child living on keeps none of the parent's charge - the parent's slot is
    seen dead and another process of the claim gets the whole limit."""
    claim = big_claim(make_claim)
    parent = ClaimProcess(claim).holding(HELD)
    try:
        child = int(parent.ask("fork")["pid"])
        assert parent.nvml_used(f"child nvml 2 {GAP_MS}") == [HELD] * 4
        assert parent.ask("child pause")["paused"] == "1"  # lives on past its parent
        parent.popen.send_signal(signal.SIGKILL)
        parent.popen.wait()
        assert charges(claim) == {}
        other = ClaimProcess(claim)
        try:
            assert other.ask("cuda")["rc"] == "0"
            assert other.ask(f"alloc {LIMIT}")["rc"] == "0"
        finally:
            other.kill()
    finally:
        parent.kill()
        os.kill(child, signal.SIGKILL)


def test_an_exec_leaves_the_old_image_charge_behind(make_claim: ClaimFactory) -> None:
    """A process holding 5 GiB execs a new program (its memory goes with the old image): the old
    image's slot is seen dead at once, and the new image, a process of the claim with the same
    pid, gets the whole limit."""
    claim = big_claim(make_claim)
    process = ClaimProcess(claim).holding(HELD)
    try:
        assert process.ask("exec")["pid"] == str(process.pid)
        assert charges(claim) == {}
        assert process.ask("cuda")["rc"] == "0"
        assert process.ask(f"alloc {LIMIT}")["rc"] == "0"
        assert charges(claim) == {process.pid: LIMIT}
    finally:
        process.kill()


def test_a_process_that_finds_every_slot_held_is_refused_until_one_comes_free(
    make_claim: ClaimFactory,
) -> None:
    """Every one of the region's process slots is held (here by another holder's OFD locks on
    their bytes, as 1 024 live processes would hold them): a process of the claim starts CUDA but
    is refused any memory, since nothing it took could be counted, and says why; once a slot comes
    free its next allocation gets one and is charged."""
    from tessera.shim.format import REGION_SLOTS

    claim = big_claim(make_claim)
    assert claim.region is not None
    holder_fd = os.open(claim.region, os.O_RDWR)
    process = ClaimProcess(claim)
    try:
        for slot in range(REGION_SLOTS):
            fcntl.fcntl(holder_fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, slot, 1, 0))
        assert process.ask("cuda")["rc"] == "0"
        assert process.ask(f"alloc {GiB}")["rc"] == OOM
        assert charges(claim) == {}
        os.close(holder_fd)
        holder_fd = -1
        assert process.ask(f"alloc {GiB}")["rc"] == "0"
        assert charges(claim) == {process.pid: GiB}
    finally:
        if holder_fd >= 0:
            os.close(holder_fd)
        process.kill()
    assert process.popen.stderr is not None
    assert f"all {REGION_SLOTS} process slots of the usage region are held by live processes" in (
        process.popen.stderr.read()
    )


# NVIDIA's clients: cuda-bindings for the driver API, nvidia-ml-py (pynvml) for NVML, each loading
# libcuda.so.1 / libnvidia-ml.so.1 its own way; under the claim's environment those are the shim.
HOLDER = textwrap.dedent(
    """
    import sys, time
    import pynvml
    from cuda.bindings import driver

    def check(result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        return rest[0] if rest else None

    check(driver.cuInit(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(0))))
    check(driver.cuCtxSetCurrent(ctx))
    held = check(driver.cuMemAlloc({held}))
    pynvml.nvmlInit()
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    readings = []
    for _ in range(2):
        readings.append(pynvml.nvmlDeviceGetMemoryInfo(device).used)
        readings.append(pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).used)
        time.sleep(0.15)
    print("used=" + ",".join(map(str, readings)), flush=True)
    if {then_allocate}:
        err, _ = driver.cuMemAlloc({limit})
        print(f"whole_limit={{int(err)}}", flush=True)
    sys.stdin.read()  # holds its memory until told to go
    """
)

ALLOCATOR = textwrap.dedent(
    """
    from cuda.bindings import driver

    assert driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS
    err, dev = driver.cuDeviceGet(0)
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    assert driver.cuCtxSetCurrent(ctx)[0] == driver.CUresult.CUDA_SUCCESS
    err, _ = driver.cuMemAlloc({limit})
    print(f"whole_limit={{int(err)}}", flush=True)
    """
)


def nvidia_holder(claim: Claim, then_allocate: bool) -> subprocess.Popen[str]:
    code = HOLDER.format(held=HELD, limit=LIMIT, then_allocate=then_allocate)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=claim.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_nvidia_clients_one_process(make_claim: ClaimFactory) -> None:
    """With NVIDIA's own clients: a process holding 5 GiB of an 8 GiB claim (cuda-bindings
    cuMemAlloc) reads NVML memory info twice 0.15 s apart (pynvml, v1 and v2) and sees 5 GiB used
    each time; its cuMemAlloc of 8 GiB then fails with CUDA_ERROR_OUT_OF_MEMORY."""
    claim = big_claim(make_claim)
    holder = nvidia_holder(claim, then_allocate=True)
    try:
        assert [int(v) for v in values(read_line(holder, "used="))["used"].split(",")] == [HELD] * 4
        assert values(read_line(holder, "whole_limit="))["whole_limit"] == OOM
    finally:
        holder.kill()
        holder.wait()


def test_nvidia_clients_two_processes(make_claim: ClaimFactory) -> None:
    """With NVIDIA's own clients: while one process holds 5 GiB and has read NVML memory info
    twice 0.15 s apart, another process of the claim is refused 8 GiB with
    CUDA_ERROR_OUT_OF_MEMORY."""
    claim = big_claim(make_claim)
    holder = nvidia_holder(claim, then_allocate=False)
    try:
        assert [int(v) for v in values(read_line(holder, "used="))["used"].split(",")] == [HELD] * 4
        other = claim.python(ALLOCATOR.format(limit=LIMIT))
        assert other.returncode == 0, other.stderr
        assert values(other.stdout)["whole_limit"] == OOM
    finally:
        holder.kill()
        holder.wait()
