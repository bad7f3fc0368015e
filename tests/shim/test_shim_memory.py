"""Memory enforcement: every allocation API counted against the claim's limit across processes,
every free path giving back, memory info virtualised (CUDA and NVML), atomic under races,
recovered from SIGKILL, safe across fork, keyed by UUID whatever CUDA_VISIBLE_DEVICES says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from simgpu.node import read_line, release
from tessera.shim._format import ffi, lib
from tessera.shim.format import read_limits, read_region
from testbed.shim_harness import Claim, ClaimFactory, prefixed, values

MiB = 1 << 20
LIMIT = 256 * MiB
APIS = ["mem", "pitch", "managed", "async", "async_ptsz", "pool", "pool_ptsz", "vmm", "array", "array3d"]


def region_used(claim: Claim, include_dead: bool = False) -> int:
    """What the claim's region says is used by live processes; with ``include_dead`` as the
    processes left it, dead processes' charges included until a process of the claim sweeps them
    (the reader never writes the region)."""
    assert claim.region is not None
    return sum(g.used_bytes for g in read_region(claim.region, include_dead=include_dead).gpus)


# A process of the claim that makes CUDA calls when told to on stdin ("alloc BYTES": cuMemAlloc,
# answers "rc N"; "info": cuMemGetInfo, answers "used N") and, when stdin closes, exits normally
# without freeing anything.
SERVANT = """
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
assert cu.cuInit(0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
print("READY", flush=True)
for line in sys.stdin:
    verb, *args = line.split()
    if verb == "alloc":
        p = ctypes.c_uint64()
        print("rc", cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(args[0]))), flush=True)
    elif verb == "info":
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
        print("used", total.value - free.value, flush=True)
"""


class Servant:
    """A running SERVANT under a claim."""

    def __init__(self, claim: Claim) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVANT],
            env=claim.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        read_line(self.process, "READY")

    def ask(self, request: str) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        return int(read_line(self.process, "").split()[1])

    def exit(self) -> None:
        """Close its stdin: it exits normally, without freeing."""
        release(self.process)
        assert self.process.returncode == 0, self.process.stderr.read() if self.process.stderr else ""


@pytest.mark.parametrize("api", APIS)
def test_allocation_api_is_counted_and_freed(make_claim: ClaimFactory, api: str) -> None:
    """Each allocation API is charged before the real call (refused past the limit with
    CUDA_ERROR_OUT_OF_MEMORY, nothing charged) and given back by its free path; VMM memory
    stays charged while mapped after cuMemRelease."""
    claim = make_claim()
    done = claim.run("shim_probe", "alloc", api, str(300 * MiB))
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["rc"] == "2"
    assert values(done.stdout)["used"] == "0"

    done = claim.run("shim_probe", "alloc", api, str(64 * MiB))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert values(lines[0])["rc"] == "0"
    held = values(lines[1])
    assert held["used"] == str(64 * MiB) and held["total"] == str(LIMIT)
    assert held["devtotal"] == str(LIMIT)
    if api == "vmm":
        assert prefixed(done.stdout, "released_mapped: ")["used"] == str(64 * MiB)
    assert values(done.stdout)["free_rc"] == "0"
    assert prefixed(done.stdout, "after: ")["used"] == "0"
    assert region_used(claim) == 0


def test_limit_is_shared_by_the_claims_processes(make_claim: ClaimFactory) -> None:
    """Two processes of one claim draw on one limit; another claim on the same GPU has its own."""
    claim = make_claim()
    holder = claim.start("shim_probe", "alloc", "mem", str(200 * MiB), "hold")
    try:
        read_line(holder, "HOLD")
        assert values(claim.run("shim_probe", "alloc", "mem", str(100 * MiB)).stdout)["rc"] == "2"
        done = claim.run("shim_probe", "alloc", "mem", str(50 * MiB))
        assert values(done.stdout.splitlines()[1])["used"] == str(250 * MiB)
        other = make_claim(name="other")
        assert values(other.run("shim_probe", "alloc", "mem", str(200 * MiB)).stdout)["rc"] == "0"
    finally:
        release(holder)


def test_nvml_memory_info_shows_the_claim(make_claim: ClaimFactory) -> None:
    """NVML memory info v1 and v2 (through unmodified pynvml) report the limit as total and the
    claim's usage as used, from any process of the claim; GPUs without a limit are untouched."""
    claim = make_claim(gpus=2)
    holder = claim.start("shim_probe", "alloc", "mem", str(96 * MiB), "hold")
    try:
        read_line(holder, "HOLD")
        code = """
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(2):
    h = n.nvmlDeviceGetHandleByIndex(i)
    v1 = n.nvmlDeviceGetMemoryInfo(h)
    v2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    out.append([v1.total, v1.used, v1.free, v2.total, v2.used, v2.free, v2.reserved])
print(json.dumps(out))
"""
        done = claim.python(code)
        assert done.returncode == 0, done.stderr
        gpu0, gpu1 = json.loads(done.stdout)
        assert gpu0 == [LIMIT, 96 * MiB, LIMIT - 96 * MiB, LIMIT, 96 * MiB, LIMIT - 96 * MiB, 0]
        assert gpu1[0] > LIMIT  # the unlimited GPU shows its own size (1 GiB when simulated)
    finally:
        release(holder)


def test_free_is_never_negative(make_claim: ClaimFactory) -> None:
    """Usage above the limit (possible only if limits shrank under running processes) shows as
    zero free, never a negative or wrapped-around number, in CUDA and NVML."""
    claim = make_claim()
    assert claim.region is not None
    h = ffi.new("struct tessera_region_handle *")
    assert lib.tessera_region_open(str(claim.region).encode(), h, ffi.NULL, 0) == 0
    try:
        assert lib.tessera_region_claim_slot(h) >= 0
        assert claim.limits is not None
        limits = read_limits(claim.limits)
        assert limits is not None
        gpu = lib.tessera_region_gpu(h.map, limits[0].uuid.encode())
        assert lib.tessera_region_reserve(h, gpu, 300 * MiB, 1 << 40) == 0
        info = values(claim.run("shim_probe", "info").stdout)
        assert info["free"] == "0" and info["total"] == str(LIMIT)
        code = (
            "import pynvml as n; n.nvmlInit(); "
            "m = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)); print(m.free, m.used)"
        )
        assert claim.python(code).stdout.split() == ["0", str(300 * MiB)]
    finally:
        lib.tessera_region_close(h)


MONITOR = """
import sys, threading, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
peak, stop = 0, threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("READY", flush=True)
while not stop.is_set():
    peak = max(peak, n.nvmlDeviceGetMemoryInfo(h).used)
print("peak", peak, "end", n.nvmlDeviceGetMemoryInfo(h).used, flush=True)
"""


def test_race_never_exceeds_the_limit(make_claim: ClaimFactory, simulated_only: None) -> None:
    """8 processes x 8 threads allocating and freeing random sizes near the limit: the GPU's
    memory in use (sampled continuously, outside the shim) never exceeds the limit, every
    refusal is CUDA_ERROR_OUT_OF_MEMORY, and at the end nothing is charged or allocated."""
    limit = 64 * MiB
    claim = make_claim(limits=[(0, limit, 0)])
    monitor = subprocess.Popen(
        [sys.executable, "-c", MONITOR],
        env=dict(claim.base_env) | {"LD_PRELOAD": ""},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        read_line(monitor, "READY")
        racers = [
            claim.start("shim_probe", "race", "8", "2000", str(4 * MiB), str(seed)) for seed in range(8)
        ]
        outs = [r.communicate(timeout=120) for r in racers]
        for racer, (out, err) in zip(racers, outs, strict=True):
            assert racer.returncode == 0, err
            assert values(out)["other"] == "0"
        assert sum(int(values(out)["ooms"]) for out, _ in outs) > 0  # it did run near the limit
        out, _ = monitor.communicate("", timeout=30)
    finally:
        monitor.kill()
    report = values(out.replace("peak ", "peak=").replace("end ", "end="))
    assert 0 < int(report["peak"]) <= limit
    assert report["end"] == "0"
    assert region_used(claim) == 0


def killed_holder(claim: Claim, nbytes: int) -> int:
    """Start a process that allocates ``nbytes`` under the claim, SIGKILL it once it holds them,
    and return its pid: it is dead, its charge still in the region."""
    holder = claim.start("shim_probe", "alloc", "mem", str(nbytes), "hold")
    read_line(holder, "HOLD")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    return holder.pid


def slot_pids(claim: Claim) -> list[int]:
    assert claim.region is not None
    return [p.pid for p in read_region(claim.region, include_dead=True).processes]


def test_sigkill_gives_memory_back_at_the_next_sweep(make_claim: ClaimFactory) -> None:
    """A process killed with SIGKILL while holding memory gives it back without anyone freeing
    it: its charge stays in the region only until a live process of the claim sweeps for dead
    ones - at once, when an allocation would not fit otherwise (a waiting process can take the
    memory), and at a memory-info call (CUDA or NVML) once the last sweep is 0.1 s old, so what
    the claim is shown is never staler than that.

    The region is read without sweeping, so only the claim's processes can have given the memory
    back. The one wait is a lower bound (at least 0.1 s since the last sweep), which a busy
    machine only lengthens."""
    claim = make_claim()
    servant = Servant(claim)
    try:
        assert servant.ask(f"alloc {MiB}") == 0  # it holds a slot of its own from now on
        dead = killed_holder(claim, 200 * MiB)
        assert region_used(claim, include_dead=True) == 201 * MiB  # charged until someone sweeps
        # 100 MiB more fits the 256 MiB limit only once the dead process's 200 MiB are swept.
        assert servant.ask(f"alloc {100 * MiB}") == 0
        assert region_used(claim, include_dead=True) == 101 * MiB
        assert dead not in slot_pids(claim)

        dead = killed_holder(claim, 100 * MiB)
        assert region_used(claim, include_dead=True) == 201 * MiB
        time.sleep(0.2)  # the last sweep (the holder's own, at its allocation) is now >= 0.1 s old
        assert servant.ask("info") == 101 * MiB
        assert region_used(claim, include_dead=True) == 101 * MiB
        assert dead not in slot_pids(claim)
    finally:
        servant.process.kill()
        servant.process.wait()


def test_sigkill_mid_allocation_blocks_no_one(make_claim: ClaimFactory) -> None:
    """Killing processes at arbitrary points of a tight alloc/free loop (mid-reservation
    included) leaves nothing charged and nobody blocked."""
    claim = make_claim()
    for _ in range(5):
        looper = claim.start("shim_probe", "loop")
        read_line(looper, "LOOPING")
        time.sleep(0.05)
        looper.send_signal(signal.SIGKILL)
        looper.wait()
        # Dead once wait() returns (the kernel dropped its slot's lock), so a reading that
        # counts live processes only must find nothing charged.
        assert region_used(claim) == 0
    done = claim.run("shim_probe", "alloc", "mem", str(LIMIT), timeout=10)
    assert values(done.stdout)["rc"] == "0"


def test_fork_is_safe(make_claim: ClaimFactory) -> None:
    """Forking while another thread allocates never leaves a child stuck on a shim lock; a
    child's CUDA calls (refused by the driver) change nothing, and the parent's usage stays its
    own until it frees."""
    claim = make_claim()
    done = claim.run("shim_probe", "fork", str(64 * MiB), timeout=120)
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["hung"] == "0"
    assert "child_status" not in done.stdout
    assert prefixed(done.stdout, "parent_after: ")["used"] == str(64 * MiB)
    assert prefixed(done.stdout, "parent_freed: ")["used"] == "0"


def test_limits_follow_the_uuid_not_the_ordinal(make_claim: ClaimFactory, simulated_only: None) -> None:
    """Limits are keyed by GPU UUID: with two GPUs and a limit on the second only, ordinal 1 is
    limited and ordinal 0 is not - and under CUDA_VISIBLE_DEVICES=1, which renumbers that GPU
    to ordinal 0, ordinal 0 is."""
    claim = make_claim(gpus=2, limits=[(1, 128 * MiB, 0)])
    plain = claim.run("shim_probe", "devices")
    assert plain.returncode == 0, plain.stderr
    devices = [values(line) for line in plain.stdout.splitlines() if line.startswith("device=")]
    assert [d["total"] for d in devices] == [str(1 << 30), str(128 * MiB)]
    assert [d["ctx_total"] for d in devices] == [str(1 << 30), str(128 * MiB)]
    limited_uuid = devices[1]["uuid"]

    renumbered = claim.run("shim_probe", "devices", env={"CUDA_VISIBLE_DEVICES": "1"})
    assert renumbered.returncode == 0, renumbered.stderr
    seen = [values(line) for line in renumbered.stdout.splitlines() if line.startswith("device=")]
    assert len(seen) == 1, seen  # only the GPU named, as ordinal 0
    assert seen[0]["uuid"] == limited_uuid and seen[0]["total"] == str(128 * MiB)
    out = claim.run("shim_probe", "alloc", "mem", str(200 * MiB), env={"CUDA_VISIBLE_DEVICES": "1"})
    assert values(out.stdout)["rc"] == "2"


def test_caching_allocator_pattern(make_claim: ClaimFactory) -> None:
    """A caching allocator grows by large blocks until CUDA_ERROR_OUT_OF_MEMORY at the limit
    (memory info exact after each block), releases cached blocks on OOM and its retry succeeds;
    at the end nothing is charged."""
    claim = make_claim()
    done = claim.run("shim_probe", "caching", str(LIMIT), str(32 * MiB))
    assert done.returncode == 0, done.stderr
    out = values(done.stdout)
    assert "mismatch" not in done.stdout
    assert out["blocks"] == "8" and out["last_rc"] == "2" and out["within"] == "1"
    assert out["retry_rc"] == "0"
    assert prefixed(done.stdout, "end: ")["used"] == "0"


def test_memory_of_exited_process_is_back_at_once(make_claim: ClaimFactory) -> None:
    """A process that exits without freeing hands its memory back as it exits (the shim's exit
    handler), not at a later sweep: read without sweeping, the region shows nothing charged the
    moment the process is gone. A process killed by a signal cannot run that handler, and its
    charge stays until a sweep - shown first, so that the test can tell the two apart."""
    claim = make_claim()
    killed = claim.start("shim_probe", "alloc", "mem", str(100 * MiB), "hold")
    read_line(killed, "HOLD")
    os.kill(killed.pid, signal.SIGTERM)  # default action: dies at once, no exit handler
    killed.wait()
    assert region_used(claim, include_dead=True) == 100 * MiB
    assert region_used(claim) == 0  # its slot's lock is free: a dead process, not counted

    servant = Servant(claim)
    try:
        assert servant.ask(f"alloc {100 * MiB}") == 0
        assert servant.ask(f"alloc {60 * MiB}") == 0
        assert region_used(claim, include_dead=True) == 160 * MiB
    finally:
        servant.exit()
    assert region_used(claim, include_dead=True) == 0


def test_pool_cache_is_counted_until_trimmed(make_claim: ClaimFactory) -> None:
    """Memory a pool keeps after cuMemFreeAsync counts against the claim until the pool releases
    it: with a high release threshold it stays counted across a sync, a same-sized allocation
    served from the cache is not counted twice, an allocation that does not fit beside the cache
    makes the shim trim the process's pools and then succeeds, and cuMemPoolTrimTo gives it back."""
    claim = make_claim()
    done = claim.run("shim_probe", "poolcache", str(1 << 40), str(100 * MiB))
    assert done.returncode == 0, done.stderr
    for step, used in [("freed", 100), ("synced", 100), ("again", 100), ("big", 200), ("refreed", 100)]:
        assert prefixed(done.stdout, f"{step}: ")["used"] == str(used * MiB), step
    assert values(done.stdout)["big_rc"] == "0"
    assert prefixed(done.stdout, "trimmed: ")["used"] == "0"
    assert region_used(claim) == 0


def test_pool_cache_released_by_sync_is_given_back(make_claim: ClaimFactory) -> None:
    """With the default release threshold (0) the cache counts until the next sync, which
    releases it; the charge follows at the process's next memory call."""
    claim = make_claim()
    done = claim.run("shim_probe", "poolcache", "0", str(100 * MiB))
    assert done.returncode == 0, done.stderr
    assert prefixed(done.stdout, "freed: ")["used"] == str(100 * MiB)
    assert prefixed(done.stdout, "synced: ")["used"] == "0"
    assert prefixed(done.stdout, "again: ")["used"] == str(100 * MiB)


def test_another_process_pool_cache_limits_the_claim(make_claim: ClaimFactory) -> None:
    """One process's pool cache is the claim's: while it holds 200 MiB cached, another process
    of the claim cannot take 100 MiB of the 256 MiB limit; once it is gone, it can."""
    claim = make_claim()
    holder = claim.start("shim_probe", "poolcache", str(1 << 40), str(200 * MiB), "hold")
    try:
        read_line(holder, "HOLD")
        done = claim.run("shim_probe", "alloc", "mem", str(100 * MiB))
        assert values(done.stdout)["rc"] == "2"
        assert values(done.stdout)["used"] == str(200 * MiB)
    finally:
        release(holder)
    assert values(claim.run("shim_probe", "alloc", "mem", str(100 * MiB)).stdout)["rc"] == "0"


def _growth_steps(stdout: str, n: int) -> list[tuple[str, int, int]]:
    """(rc, pool reservation, claim's usage) after each step of ``shim_probe poolgrowth``."""
    steps = [prefixed(stdout, f"step{i}: ") for i in range(n)]
    return [(v["rc"], int(v["reserved"]), int(v["used"])) for v in steps]


def test_pool_growth_is_charged_before_the_driver_is_called(make_claim: ClaimFactory) -> None:
    """A pool grows in 2 MiB chunks, and the shim charges a chunk before every stream-ordered
    allocation (it cannot tell whether the pool's free memory holds it in one piece), refunding
    what the pool did not grow by once the call returns. With a 4.5 MiB limit: 1 MiB from a new
    pool takes a whole chunk (2 MiB charged, 1 MiB of it the pool's free memory), leaving
    2.5 MiB of headroom. 3 MiB would grow the pool by 4 MiB: refused with
    CUDA_ERROR_OUT_OF_MEMORY before the driver is called (the pool did not grow). 512 KiB is
    charged a chunk, fits in the chunk already reserved, and the chunk is refunded: the claim
    still holds 2 MiB. 2 MiB grows the pool by a chunk, charged beforehand: 4 MiB. 512 KiB more,
    although the first chunk has 512 KiB free, is refused now: a chunk does not fit in the
    0.5 MiB of headroom. The claim never holds more than its limit, nor less than the pool
    reserves."""
    limit = 4 * MiB + MiB // 2
    claim = make_claim(limits=((0, limit, 0),))
    done = claim.run("shim_probe", "poolgrowth", "1024", "3072", "512", "2048", "512")
    assert done.returncode == 0, done.stderr
    assert _growth_steps(done.stdout, 5) == [
        ("0", 2 * MiB, 2 * MiB),
        ("2", 2 * MiB, 2 * MiB),
        ("0", 2 * MiB, 2 * MiB),
        ("0", 4 * MiB, 4 * MiB),
        ("2", 4 * MiB, 4 * MiB),
    ]
    assert prefixed(done.stdout, "trimmed: ")["used"] == "0"
    assert region_used(claim) == 0


def test_pool_growth_trims_other_pools_to_make_room(make_claim: ClaimFactory) -> None:
    """Growth that does not fit beside what the process's pools cache makes the shim trim them,
    as for any allocation: with a 3 MiB limit, a pool's 2 MiB chunk stays cached after its
    allocation is freed; 512 KiB from another pool needs a chunk of its own, which fits only once
    the first pool is trimmed, and then succeeds."""
    claim = make_claim(limits=((0, 3 * MiB, 0),))
    done = claim.run("shim_probe", "poolgrowth", "2048", "free", "pool", "512")
    assert done.returncode == 0, done.stderr
    assert _growth_steps(done.stdout, 4) == [
        ("0", 2 * MiB, 2 * MiB),
        ("0", 2 * MiB, 2 * MiB),
        ("0", 0, 2 * MiB),
        ("0", 2 * MiB, 2 * MiB),
    ]
    assert prefixed(done.stdout, "trimmed: ")["used"] == "0"
    assert region_used(claim) == 0


def test_pool_growth_beside_fragmented_free_memory_never_passes_the_limit(
    make_claim: ClaimFactory,
) -> None:
    """An allocation the pool's free memory holds in total, but in pieces none of which holds it,
    grows the pool; the chunk it grows by was charged before the driver was called, so the claim
    never holds more than its limit. With a 5.5 MiB limit: 1 MiB and 1.5 MiB take two chunks
    (4 MiB); 1.25 MiB (1.5 MiB is free in total, 1 MiB + 0.5 MiB) needs a chunk, which does not
    fit in the 1.5 MiB of headroom: refused before the driver is called, the pool does not grow
    (it grew a third chunk, past the limit, before); so is 512 KiB. While the process holds what
    it has, the claim holds 4 MiB, what the device holds for it."""
    limit = 5 * MiB + MiB // 2
    claim = make_claim(limits=((0, limit, 0),))
    holder = claim.start("shim_probe", "poolgrowth", "1024", "1536", "1280", "512", "hold")
    try:
        steps = [prefixed(read_line(holder, f"step{i}: "), f"step{i}: ") for i in range(4)]
        read_line(holder, "HOLD")
        assert region_used(claim) == 4 * MiB <= limit
    finally:
        release(holder)
    got = [(v["rc"], int(v["reserved"]), int(v["used"])) for v in steps]
    assert got == [
        ("0", 2 * MiB, 2 * MiB),
        ("0", 4 * MiB, 4 * MiB),
        ("2", 4 * MiB, 4 * MiB),
        ("2", 4 * MiB, 4 * MiB),
    ]
    assert all(used <= limit for _, _, used in got)
    assert holder.returncode == 0
    assert region_used(claim) == 0


def test_pool_growth_beside_fragmented_free_memory_is_charged_beforehand(
    make_claim: ClaimFactory,
) -> None:
    """With a 6 MiB limit the same fragmented allocation fits: 1.25 MiB is charged a chunk
    before the call, the pool grows its third chunk, and the claim holds 6 MiB, exactly what the
    device holds for it and no more than its limit. 512 KiB more is refused (no room for a
    chunk)."""
    limit = 6 * MiB
    claim = make_claim(limits=((0, limit, 0),))
    holder = claim.start("shim_probe", "poolgrowth", "1024", "1536", "1280", "512", "hold")
    try:
        steps = [prefixed(read_line(holder, f"step{i}: "), f"step{i}: ") for i in range(4)]
        read_line(holder, "HOLD")
        assert region_used(claim) == 6 * MiB
    finally:
        release(holder)
    assert [(v["rc"], int(v["reserved"]), int(v["used"])) for v in steps] == [
        ("0", 2 * MiB, 2 * MiB),
        ("0", 4 * MiB, 4 * MiB),
        ("0", 6 * MiB, 6 * MiB),
        ("2", 6 * MiB, 6 * MiB),
    ]
    assert holder.returncode == 0
    assert region_used(claim) == 0


@pytest.mark.parametrize("how", ["async", "sync", "ctx"])
def test_destroyed_pool_is_charged_until_its_last_allocation_is_gone(
    make_claim: ClaimFactory, how: str
) -> None:
    """A pool destroyed while allocations from it are out keeps its reservation in the driver
    until the last of them is gone, and the claim keeps being charged for all of it: 1 MiB and
    512 KiB from a new pool take a 2 MiB chunk; after cuMemPoolDestroy the claim still holds
    2 MiB (the 512 KiB free beside them included), and after the 1 MiB is freed too; once the
    last allocation is gone - freed with cuMemFreeAsync, with cuMemFree, or with the context it
    was made in destroyed - the pool's reservation is refunded and the claim holds nothing."""
    claim = make_claim()
    done = claim.run("shim_probe", "pooldestroy", how)
    assert done.returncode == 0, done.stderr
    for step, used in [("alloced", 2 * MiB), ("destroyed", 2 * MiB), ("one", 2 * MiB), ("last", 0)]:
        assert prefixed(done.stdout, f"{step}: ")["used"] == str(used), step
    assert region_used(claim) == 0


def test_pools_per_device_are_bounded(make_claim: ClaimFactory) -> None:
    """A process can have 63 pools of its own per device (the 64th place is the default pool's);
    one more is destroyed and refused with CUDA_ERROR_OUT_OF_MEMORY, destroying one makes room,
    and cuMemPoolTrimTo of an invalid pool is the driver's error."""
    done = make_claim().run("shim_probe", "pools")
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["created"] == "63" and values(done.stdout)["rc"] == "2"
    assert values(done.stdout)["again_rc"] == "0"
    assert values(done.stdout)["trim_invalid_rc"] == "1"
