"""Fault injection through the node's configuration: failing the Nth allocation, a GPU falling
off the bus under a running process, and added call latency."""

from __future__ import annotations

import select
import subprocess
import sys
from dataclasses import replace

import pytest

from simgpu.config import GpuFaults
from simgpu.node import NodeFactory, read_line

DEVICE_UNAVAILABLE = 46  # what CUDA calls return for a GPU that fell off the bus
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST


def values(stdout: str) -> dict[str, str]:
    """The probe's "name value" lines as a dict."""
    return dict(line.split(maxsplit=1) for line in stdout.splitlines() if line.strip())


def test_nth_allocation_fails(make_node: NodeFactory) -> None:
    """With fail_alloc = 3, each process's third allocation on that GPU fails with
    CUDA_ERROR_OUT_OF_MEMORY although memory is free; the others succeed."""
    node = make_node(name="nth")
    node.update(replace(node.spec, gpus=(replace(node.spec.gpus[0], faults=GpuFaults(fail_alloc=3)),)))
    for _ in range(2):  # counted per process: a second process fails on its third too
        done = node.program("simgpu_probe", "alloc", "0", "4096", "5")
        results = [line.split()[2] for line in done.stdout.splitlines() if line.startswith("alloc")]
        assert results == ["0", "0", "2", "0", "0"]


def test_gpu_falls_off_the_bus_under_a_running_process(make_node: NodeFactory) -> None:
    """Marking GPU 0 lost in the configuration makes the running process's allocation and
    synchronisation fail with CUDA_ERROR_DEVICE_UNAVAILABLE within the 20 ms poll interval, NVML
    answer NVML_ERROR_GPU_IS_LOST for GPU 0, and leaves GPU 1 working.

    "Within the poll interval" is counted in the probe's rounds, not measured in seconds (a busy
    machine stretches seconds, not rounds): each round sleeps 20 ms, so by the start of its third
    round after the probe itself saw the file change, at least 40 ms have passed since the
    driver could first have seen it - more than its 20 ms interval plus a tick of the coarse
    clock it is timed with (at most 10 ms) - and that round's calls must fail."""
    node = make_node(gpus=2, name="lost")
    worker = node.start("simgpu_probe", "wait-lost", "0")
    try:
        read_line(worker, "ready")
        lost = replace(node.spec.gpus[0], faults=GpuFaults(lost=True))
        node.update(replace(node.spec, gpus=(lost, node.spec.gpus[1])))
        assert read_line(worker, "lost") == f"lost {DEVICE_UNAVAILABLE} {DEVICE_UNAVAILABLE}"
        rounds = int(read_line(worker, "rounds_after_change").split()[1])
        assert rounds <= 3, rounds
        worker.wait(timeout=10)
    finally:
        worker.kill()
        worker.wait()
    seen = node.python_json(
        """
import ctypes, json, pynvml as n
n.nvmlInit()
out = {}
try:
    n.nvmlDeviceGetHandleByIndex(0)
except n.NVMLError as e:
    out["nvml0"] = e.value
out["nvml1"] = n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(1))
cu = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
out["init"] = cu.cuInit(0)
out["ctx0"] = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
out["ctx1"] = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1)
print(json.dumps(out))
"""
    )
    assert seen == {
        "nvml0": GPU_IS_LOST,
        "nvml1": node.spec.gpus[1].name,
        "init": 0,
        "ctx0": DEVICE_UNAVAILABLE,
        "ctx1": 0,
    }


def test_call_latency(make_node: NodeFactory) -> None:
    """latency_us adds that much time to every API call (here cuDeviceGetCount), and can be
    switched on for running processes by rewriting the configuration.

    Judged by the shortest of 200 calls: the scheduler only ever makes a call longer, so with
    2 ms of latency even the shortest takes 2 ms (whatever the load). Without it, the test asserts
    only the order of magnitude — the shortest call is below the latency switched on next — which a
    loaded machine cannot break (it would have to delay every one of the 200 calls by 2 ms); what a
    plain call costs is benchmarks/simgpu/call_cost.py's figure, not this test's."""
    latency_ns = 2_000_000
    node = make_node(name="slow")
    fast = node.program("simgpu_probe", "latency", "200")
    assert fast.returncode == 0, fast.stderr
    assert int(values(fast.stdout)["min_ns"]) < latency_ns
    node.update(replace(node.spec, latency_us=latency_ns // 1000))
    slow = node.program("simgpu_probe", "latency", "200")
    assert slow.returncode == 0, slow.stderr
    assert int(values(slow.stdout)["min_ns"]) >= latency_ns


POLL_NS = 20_000_000  # how often, at most, a process looks at its configuration file


def test_calls_do_not_look_at_the_configuration_each_time(make_node: NodeFactory) -> None:
    """The live-fault check costs a clock read per call, not a stat() of the configuration file
    (which made every call about 450 ns slower): over 20 000 calls of cuCtxGetCurrent, and
    20 000 launches of a zero-length kernel, the process makes at most one stat() per 20 ms
    poll interval that the calls took (plus the one the first call may make).

    Counted with ptrace in the probe, so the figure does not move with the machine's load (what
    the calls cost in nanoseconds is a benchmark figure: benchmarks/simgpu/call_cost.py)."""
    done = make_node(name="cost").program("simgpu_probe", "call-syscalls", "20000")
    if done.returncode == 4:
        pytest.skip(f"this machine refuses ptrace to its own child: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    seen = values(done.stdout)
    for phase in ("ctx_get_current", "launch"):
        polls = int(seen[f"{phase}_ns"]) // POLL_NS + 1
        assert int(seen[f"{phase}_stats"]) <= polls, (phase, seen)


def test_broken_rewrite_keeps_previous_faults(make_node: NodeFactory) -> None:
    """A configuration rewritten with an error leaves a running process's faults as they were and
    says why on stderr, rather than failing its calls: once it has said so it is still working,
    and a valid rewrite after that still reaches it. (Waiting for its message, not for a fixed
    time, makes sure it has read the broken file, however busy the machine.)"""
    node = make_node(name="keep")
    worker = node.start("simgpu_probe", "wait-lost", "0")
    try:
        read_line(worker, "ready")
        node.config.write_text(node.config.read_text() + "\nnonsense\n")
        assert worker.stderr is not None
        # Written in place, so the worker may first read it half-written: wait for its verdict
        # on the whole file.
        complaint = next((line for line in worker.stderr if "nonsense" in line), "(stderr closed)")
        assert "keeping previous fault settings" in complaint
        assert "expected 'key = value', got 'nonsense'" in complaint
        assert worker.poll() is None  # still working: the bad file changed nothing
        lost = replace(node.spec.gpus[0], faults=GpuFaults(lost=True))
        node.update(replace(node.spec, gpus=(lost,)))
        assert read_line(worker, "lost") == f"lost {DEVICE_UNAVAILABLE} {DEVICE_UNAVAILABLE}"
    finally:
        worker.kill()
        worker.communicate()


NVML_CALL_THAT_HANGS = """
import pynvml as n
n.nvmlInit()
n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(1))
print("other gpu answers", flush=True)
n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0))
print("hung gpu answers", flush=True)
"""


def test_nvml_calls_on_a_hung_gpu_block_until_the_fault_is_cleared(make_node: NodeFactory) -> None:
    """With nvml_hang on GPU 0, an NVML call that touches it neither answers nor fails (a wedged
    driver, as the node daemon's watchdog must meet it), calls on GPU 1 answer, and clearing the
    fault lets the blocked call return normally."""
    node = make_node(gpus=2, name="hang")
    hung = replace(node.spec.gpus[0], faults=GpuFaults(nvml_hang=True))
    node.update(replace(node.spec, gpus=(hung, node.spec.gpus[1])))
    caller = subprocess.Popen(
        [sys.executable, "-c", NVML_CALL_THAT_HANGS], env=node.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert caller.stdout is not None and read_line(caller, "other gpu") == "other gpu answers"
        ready, _, _ = select.select([caller.stdout], [], [], 1.0)
        assert not ready and caller.poll() is None, "the call on the hung GPU returned"
        node.update(replace(node.spec, gpus=(replace(hung, faults=GpuFaults()), node.spec.gpus[1])))
        assert read_line(caller, "hung gpu") == "hung gpu answers"
        assert caller.wait(30) == 0
    finally:
        caller.kill()
        caller.wait()
