"""CUDA_VISIBLE_DEVICES selects and renumbers the GPUs libcuda shows, as NVIDIA's driver does;
NVML ignores it, and the work of a renumbered device lands on the physical GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simgpu.config import GiB
from simgpu.node import Node, NodeFactory, read_line, release

NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE
MiB = 1 << 20

# What libcuda shows: cuInit's result and, per ordinal, the UUID (as nvidia-smi prints it), PCI
# bus id and memory size.
LIST_CUDA = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
out = {"init": cu.cuInit(0), "devices": []}
count = ctypes.c_int(0)
if out["init"] == 0:
    assert cu.cuDeviceGetCount(ctypes.byref(count)) == 0
for i in range(count.value):
    raw = (ctypes.c_ubyte * 16)()
    bus = ctypes.create_string_buffer(32)
    total = ctypes.c_size_t()
    assert cu.cuDeviceGetUuid(raw, i) == 0
    assert cu.cuDeviceGetPCIBusId(bus, 32, i) == 0
    assert cu.cuDeviceTotalMem_v2(ctypes.byref(total), i) == 0
    h = bytes(raw).hex()
    uuid = f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    out["devices"].append(dict(uuid=uuid, pci=bus.value.decode(), total=total.value))
print(json.dumps(out))
"""


def cuda_view(node: Node, visible: str) -> tuple[int, list[str]]:
    """cuInit's result and the UUIDs of ordinals 0..n-1 under CUDA_VISIBLE_DEVICES=visible."""
    seen = node.python_json(LIST_CUDA, env={"CUDA_VISIBLE_DEVICES": visible})
    assert isinstance(seen, dict)
    return seen["init"], [d["uuid"] for d in seen["devices"]]


@pytest.fixture
def three(make_node: NodeFactory) -> Node:
    """Three GPUs of different memory sizes, so a renumbered device is recognisable by size too."""
    node = make_node(gpus=3, name="vis")
    gpus = tuple(replace(g, memory_bytes=(i + 1) * GiB) for i, g in enumerate(node.spec.gpus))
    node.update(replace(node.spec, gpus=gpus))
    return node


def test_listed_gpus_are_renumbered_in_list_order(three: Node) -> None:
    """CUDA_VISIBLE_DEVICES=2,0 shows two devices: ordinal 0 is GPU 2 and ordinal 1 is GPU 0,
    each with its physical UUID, PCI bus id and memory size."""
    seen = three.python_json(LIST_CUDA, env={"CUDA_VISIBLE_DEVICES": "2,0"})
    assert isinstance(seen, dict)
    assert seen["init"] == 0
    want = [three.spec.gpus[2], three.spec.gpus[0]]
    assert [d["uuid"] for d in seen["devices"]] == [g.uuid for g in want]
    assert [d["pci"] for d in seen["devices"]] == [g.pci_bus_id[4:] for g in want]  # 4-digit domain
    assert [d["total"] for d in seen["devices"]] == [g.memory_bytes for g in want]


def test_unset_shows_every_gpu(three: Node) -> None:
    """Without CUDA_VISIBLE_DEVICES every GPU is visible, in configuration order."""
    seen = three.python_json(LIST_CUDA)
    assert isinstance(seen, dict)
    assert [d["uuid"] for d in seen["devices"]] == [g.uuid for g in three.spec.gpus]


def test_gpus_named_by_uuid_or_unique_prefix(three: Node) -> None:
    """Entries may be full UUIDs, unique UUID prefixes (with "GPU-") and indices, mixed, with
    blanks around them; an index is read like strtoul, so "1x" is GPU 1."""
    u = [g.uuid for g in three.spec.gpus]
    assert cuda_view(three, f"{u[1]},{u[2][:12]}, 0") == (0, [u[1], u[2], u[0]])
    assert cuda_view(three, "1x,2") == (0, [u[1], u[2]])


def test_list_ends_at_the_first_invalid_entry(three: Node) -> None:
    """Only the GPUs before the first invalid entry are visible: a negative or out-of-range
    index, an empty entry, an unknown or ambiguous UUID, or anything else."""
    u = [g.uuid for g in three.spec.gpus]
    assert cuda_view(three, "0,2,-1,1") == (0, [u[0], u[2]])
    assert cuda_view(three, "1,3,0") == (0, [u[1]])
    assert cuda_view(three, "2,,0") == (0, [u[2]])
    assert cuda_view(three, "0,GPU-ffffffff,1") == (0, [u[0]])
    assert cuda_view(three, "2,GPU-,1") == (0, [u[2]])  # "GPU-" alone matches all three
    assert cuda_view(three, "1,MIG-0,0") == (0, [u[1]])


def test_no_visible_gpu_means_no_device(three: Node) -> None:
    """An empty value, an invalid first entry, or a GPU named twice (by index or by UUID) leaves
    no device: cuInit returns CUDA_ERROR_NO_DEVICE."""
    u = [g.uuid for g in three.spec.gpus]
    for visible in ["", "3", "-1", "abc", "0,1,0", f"2,{u[2]}", f"1,0,{u[1][:10]}"]:
        assert cuda_view(three, visible) == (NO_DEVICE, []), visible


def test_nvml_ignores_the_variable_and_sees_work_on_the_physical_gpu(make_node: NodeFactory) -> None:
    """Under CUDA_VISIBLE_DEVICES=1 a process allocating on ordinal 0 uses GPU 1: NVML (which
    still lists both GPUs) reports the memory and the process on GPU 1 and nothing on GPU 0, and
    the kernel time of ordinal 0 lands on GPU 1's utilisation.

    The utilisation window is 30 s here, not the default 1 s: the 600 ms the workload kept GPU 1
    busy (2 % of it) must still be in the window when a new Python process has started and
    asked, which on a machine with every core busy took over a second."""
    node = make_node(gpus=2, name="visnvml", util_window_ms=30_000)
    holder = node.start("simgpu_probe", "alloc", "0", str(64 * MiB), "1", env={"CUDA_VISIBLE_DEVICES": "1"})
    try:
        assert read_line(holder, "alloc") == "alloc 0 0"
        read_line(holder, "holding")
        seen = node.python_json(
            """
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    out.append(dict(uuid=n.nvmlDeviceGetUUID(h), used=n.nvmlDeviceGetMemoryInfo(h).used,
                    pids=[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]))
print(json.dumps(out))
""",
            env={"CUDA_VISIBLE_DEVICES": "1"},
        )
        assert seen == [
            {"uuid": node.spec.gpus[0].uuid, "used": 0, "pids": []},
            {"uuid": node.spec.gpus[1].uuid, "used": 64 * MiB, "pids": [holder.pid]},
        ]
    finally:
        release(holder)
    busy = node.program("simgpu_probe", "duty", "0", "100", "100", "600", env={"CUDA_VISIBLE_DEVICES": "1"})
    assert busy.returncode == 0, busy.stderr
    util = node.python_json(
        """
import json, pynvml as n
n.nvmlInit()
print(json.dumps([n.nvmlDeviceGetUtilizationRates(n.nvmlDeviceGetHandleByIndex(i)).gpu for i in range(2)]))
"""
    )
    assert isinstance(util, list)
    assert util == [0, 2]  # 600 ms of 30 s on GPU 1, nothing on GPU 0
