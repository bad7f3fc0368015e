"""Fault injection through the node's configuration: failing the Nth allocation, a GPU falling
off the bus under a running process, and added call latency."""

from __future__ import annotations

import time
from dataclasses import replace

from tessera.simgpu.config import GpuFaults
from tessera.simgpu.node import NodeFactory, read_line

DEVICE_UNAVAILABLE = 46  # what CUDA calls return for a GPU that fell off the bus
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST


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
    synchronisation fail with CUDA_ERROR_DEVICE_UNAVAILABLE within the 20 ms poll interval (the
    probe calls every 20 ms; asserted loosely, under 0.5 s), NVML answer NVML_ERROR_GPU_IS_LOST
    for GPU 0, and leaves GPU 1 working."""
    node = make_node(gpus=2, name="lost")
    worker = node.start("simgpu_probe", "wait-lost", "0")
    try:
        read_line(worker, "ready")
        lost = replace(node.spec.gpus[0], faults=GpuFaults(lost=True))
        start = time.monotonic()
        node.update(replace(node.spec, gpus=(lost, node.spec.gpus[1])))
        assert read_line(worker, "lost") == f"lost {DEVICE_UNAVAILABLE} {DEVICE_UNAVAILABLE}"
        assert time.monotonic() - start < 0.5
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
    switched on for running processes by rewriting the configuration."""
    node = make_node(name="slow")
    fast = node.program("simgpu_probe", "latency", "200")
    assert int(fast.stdout.split()[1]) < 500_000
    node.update(replace(node.spec, latency_us=2000))
    slow = node.program("simgpu_probe", "latency", "200")
    assert int(slow.stdout.split()[1]) >= 2_000_000


def test_calls_do_not_look_at_the_configuration_each_time(make_node: NodeFactory) -> None:
    """The live-fault check costs a clock read per call, not a stat() of the configuration file
    (which made every call take about 450 ns): the mean cost of cuCtxGetCurrent stays under
    200 ns and that of launching a zero-length kernel under 400 ns (about 10 ns and 70 ns on an
    idle machine; the bounds leave room for a loaded one)."""
    done = make_node(name="cost").program("simgpu_probe", "call-cost", "200000")
    assert done.returncode == 0, done.stderr
    cost = dict(line.split() for line in done.stdout.splitlines())
    assert int(cost["ctx_get_current_ns"]) < 200
    assert int(cost["launch_ns"]) < 400


def test_broken_rewrite_keeps_previous_faults(make_node: NodeFactory) -> None:
    """A configuration rewritten with an error leaves a running process's faults as they were and
    says why on stderr, rather than failing its calls."""
    node = make_node(name="keep")
    worker = node.start("simgpu_probe", "wait-lost", "0")
    try:
        read_line(worker, "ready")
        node.config.write_text(node.config.read_text() + "\nnonsense\n")
        lost = replace(node.spec.gpus[0], faults=GpuFaults(lost=True))
        time.sleep(0.3)
        assert worker.poll() is None  # still working: the bad file changed nothing
        node.update(replace(node.spec, gpus=(lost,)))
        assert read_line(worker, "lost").startswith("lost")
    finally:
        worker.kill()
        _, err = worker.communicate()
    assert "keeping previous fault settings" in err
    assert "expected 'key = value', got 'nonsense'" in err
