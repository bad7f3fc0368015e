"""Device memory is one physical pool shared by every process of a node, and a process's memory
goes back to the GPU when the process dies, however it dies. Processes racing on the node's
shared state (creating it at once, reclaiming the same dead processes at once) leave it in one
consistent state."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from simgpu.node import Node, NodeFactory, program_dir, read_line, release

MiB = 1 << 20
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY

MEMORY = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
procs = {p.pid: p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)}
print(json.dumps(dict(used=m.used, free=m.free, procs={str(k): v for k, v in procs.items()})))
"""


def allocations(lines: list[str]) -> list[int]:
    return [int(line.split()[2]) for line in lines]


def test_memory_runs_out_across_two_processes(make_node: NodeFactory) -> None:
    """Two processes draw on one GPU's memory: once the first holds 768 MiB of 1 GiB, the second
    gets 256 MiB and then CUDA_ERROR_OUT_OF_MEMORY; NVML shows both processes and their usage."""
    node = make_node(name="oom")
    first = node.start("simgpu_probe", "alloc", "0", str(256 * MiB), "3")
    second = None
    try:
        held = [read_line(first, "alloc") for _ in range(3)]
        assert allocations(held) == [0, 0, 0]
        read_line(first, "holding")
        second = node.start("simgpu_probe", "alloc", "0", str(256 * MiB), "2")
        assert allocations([read_line(second, "alloc") for _ in range(2)]) == [0, OOM]
        read_line(second, "holding")
        seen = node.python_json(MEMORY)
        assert isinstance(seen, dict)
        assert seen["used"] == 1024 * MiB
        assert seen["free"] == 0
        assert seen["procs"] == {str(first.pid): 768 * MiB, str(second.pid): 256 * MiB}
    finally:
        release(first)
        if second is not None:
            release(second)
    after = node.python_json(MEMORY)
    assert after == {"used": 0, "free": 1024 * MiB, "procs": {}}


def test_sigkill_returns_memory(make_node: NodeFactory) -> None:
    """Memory of a process killed with SIGKILL (no cleanup code runs) is free again for the next
    allocation and in NVML, and the process leaves NVML's list of running processes."""
    node = make_node(name="kill")
    victim = node.start("simgpu_probe", "alloc", "0", str(900 * MiB), "1")
    assert allocations([read_line(victim, "alloc")]) == [0]
    read_line(victim, "holding")
    seen = node.python_json(MEMORY)
    assert isinstance(seen, dict)
    assert seen["used"] == 900 * MiB
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert node.python_json(MEMORY) == {"used": 0, "free": 1024 * MiB, "procs": {}}
    successor = node.start("simgpu_probe", "alloc", "0", str(1024 * MiB), "1")
    try:
        assert allocations([read_line(successor, "alloc")]) == [0]
    finally:
        release(successor)


def test_sigkill_memory_is_reclaimed_by_the_next_allocation(make_node: NodeFactory) -> None:
    """Without any NVML query in between, an allocation that would not fit first reclaims the
    memory of dead processes, so it succeeds."""
    node = make_node(name="reclaim")
    victim = node.start("simgpu_probe", "alloc", "0", str(1024 * MiB), "1")
    assert allocations([read_line(victim, "alloc")]) == [0]
    read_line(victim, "holding")
    victim.kill()
    victim.wait(timeout=10)
    done = node.program("simgpu_probe", "alloc", "0", str(1024 * MiB), "1")
    assert done.stdout.splitlines()[0] == "alloc 0 0"


def test_process_dying_while_holding_the_state_lock_does_not_wedge_the_node(
    make_node: NodeFactory,
) -> None:
    """A process killed while it holds the node's shared lock leaves it recoverable: the next
    process's allocation goes through instead of waiting forever."""
    node = make_node(name="wedge")
    assert node.program("simgpu_probe", "alloc", "0", "4096", "1").returncode == 0
    holder = node.start("state_lock_holder", str(node.spec.state_file))
    read_line(holder, "locked")
    holder.kill()
    holder.wait(timeout=10)
    done = node.program("simgpu_probe", "alloc", "0", str(1024 * MiB), "1", timeout=20)
    assert done.stdout.splitlines()[0] == "alloc 0 0"


# Each racer sleeps until a common instant, then becomes the probe: they all reach cuInit (or the
# allocation after it) within about a millisecond of each other instead of staggered by start-up.
RACER = (
    "import os, sys, time; time.sleep(max(0.0, float(sys.argv[1]) - time.time())); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def start_together(node: Node, count: int, *args: str) -> list[subprocess.Popen[str]]:
    at = time.time() + 1.0
    probe = str(program_dir() / args[0])
    return [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(at), probe, *args[1:]],
            env=node.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]


def test_processes_creating_the_state_file_at_once_share_one_state(make_node: NodeFactory) -> None:
    """Twelve processes start on a fresh node (no state file yet) and call cuInit and allocate
    64 MiB at the same instant: all succeed, and NVML then sees every one of them with its 64 MiB
    in one shared state, not several states overwriting each other."""
    node = make_node(name="create")
    assert not node.spec.state_file.exists()
    racers = start_together(node, 12, "simgpu_probe", "alloc", "0", str(64 * MiB), "1")
    try:
        for proc in racers:
            assert allocations([read_line(proc, "alloc")]) == [0]
            read_line(proc, "holding")
        seen = node.python_json(MEMORY)
        assert isinstance(seen, dict)
        assert seen["used"] == 12 * 64 * MiB
        assert seen["procs"] == {str(proc.pid): 64 * MiB for proc in racers}
    finally:
        for proc in racers:
            release(proc)
    assert node.python_json(MEMORY) == {"used": 0, "free": 1024 * MiB, "procs": {}}


def test_concurrent_reclaims_of_dead_processes_agree(make_node: NodeFactory) -> None:
    """Four processes fill the 1 GiB GPU and are killed. Four successors then ask for 256 MiB at
    the same instant, so each must reclaim the dead processes' memory while the others do the
    same: every allocation succeeds, and the GPU ends exactly full with the successors' memory,
    nothing freed twice and nothing of the dead left behind."""
    node = make_node(name="reap")
    victims = [node.start("simgpu_probe", "alloc", "0", str(256 * MiB), "1") for _ in range(4)]
    for proc in victims:
        assert allocations([read_line(proc, "alloc")]) == [0]
        read_line(proc, "holding")
    for proc in victims:
        proc.kill()
        proc.wait(timeout=10)
    successors = start_together(node, 4, "simgpu_probe", "alloc", "0", str(256 * MiB), "1")
    try:
        for proc in successors:
            assert allocations([read_line(proc, "alloc")]) == [0]
            read_line(proc, "holding")
        seen = node.python_json(MEMORY)
        assert isinstance(seen, dict)
        assert (seen["used"], seen["free"]) == (1024 * MiB, 0)
        assert seen["procs"] == {str(proc.pid): 256 * MiB for proc in successors}
    finally:
        for proc in successors:
            release(proc)
    assert node.python_json(MEMORY) == {"used": 0, "free": 1024 * MiB, "procs": {}}
