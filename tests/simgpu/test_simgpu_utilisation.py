"""NVML's utilisation is computed from the kernel timeline: for a process that keeps the GPU busy
25 %, 50 % or 100 % of the time, NVML reports the busy share of its sample window within 2
percentage points of the timeline the process actually achieved (measured with CUDA events)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tessera.simgpu.node import NodeFactory

WINDOW_NS = 1_000_000_000  # util_window_ms = 1000, the default
TOLERANCE = 2.0  # percentage points

# Samples NVML while the workload runs: (monotonic ns at the query, device %, per-process %).
SAMPLER = """
import json, sys, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
time.sleep(float(sys.argv[1]))
out = []
for _ in range(int(sys.argv[2])):
    before = time.monotonic_ns()
    gpu = n.nvmlDeviceGetUtilizationRates(h).gpu
    procs = {s.pid: s.smUtil for s in n.nvmlDeviceGetProcessUtilization(h, 0)}
    after = time.monotonic_ns()
    out.append([(before + after) // 2, gpu, procs])
    time.sleep(0.5)
print(json.dumps(out))
"""


def busy_percent(intervals: list[tuple[int, int]], at: int) -> float:
    start = at - WINDOW_NS
    busy = sum(max(0, min(e, at) - max(s, start)) for s, e in intervals)
    return 100.0 * busy / WINDOW_NS


@pytest.mark.parametrize("duty", [25, 50, 100])
def test_nvml_utilisation_matches_kernel_timeline(make_node: NodeFactory, duty: int) -> None:
    """Device and per-process utilisation from NVML agree with the achieved kernel timeline to
    within 2 percentage points at every sample (period 100 ms, 6 s run, 8 samples)."""
    node = make_node(name=f"duty{duty}")
    workload = node.start("simgpu_probe", "duty", "0", str(duty), "100", "6000")
    sampler = subprocess.run(
        [sys.executable, "-c", SAMPLER, "1.5", "8"],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out, err = workload.communicate(timeout=60)
    assert workload.returncode == 0, err
    intervals = [
        (int(a), int(b))
        for _, a, b in (line.split() for line in out.splitlines() if line.startswith("interval"))
    ]
    errors = []
    for at, gpu, procs in json.loads(sampler.stdout):
        expected = busy_percent(intervals, at)
        assert abs(gpu - expected) <= TOLERANCE, (at, gpu, expected)
        assert abs(procs[str(workload.pid)] - expected) <= TOLERANCE, (at, procs, expected)
        errors.append(abs(gpu - expected))
    assert expected == pytest.approx(duty, abs=5)  # the workload did what it says
    print(f"duty {duty}%: max |NVML - timeline| = {max(errors):.2f} pp")


def test_kernels_of_two_processes_are_serialised(make_node: NodeFactory) -> None:
    """Kernels from different processes never overlap on the GPU (time slicing, no MPS): two
    processes each asking for 60 % of the GPU together get 100 %, shared between them."""
    node = make_node(name="shared")
    workloads = [node.start("simgpu_probe", "duty", "0", "60", "100", "5000") for _ in range(2)]
    sampler = subprocess.run(
        [sys.executable, "-c", SAMPLER, "2", "4"],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for w in workloads:
        w.communicate(timeout=60)
    for _, gpu, procs in json.loads(sampler.stdout):
        assert gpu >= 98
        assert sum(procs.values()) == pytest.approx(gpu, abs=2)
        assert all(30 <= procs[str(w.pid)] <= 70 for w in workloads)
