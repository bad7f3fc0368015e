"""MIG mode: NVML lists a GPU's instances while it is in MIG mode, CUDA shows an instance named by
its MIG UUID as a device of its own with that instance's memory, and a test can switch the mode of
a GPU under running processes."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from simgpu.config import GiB, mig_instances
from simgpu.node import Node, NodeFactory, read_line, release

MiB = 1 << 20
PROFILES = (("1g.10gb", 10 * GiB), ("2g.20gb", 20 * GiB))


@pytest.fixture
def mig_node(make_node: NodeFactory) -> Node:
    """Two 80 GiB GPUs: GPU 0 in MIG mode with a 1g.10gb and a 2g.20gb instance, GPU 1 whole."""
    node = make_node(gpus=2, name="mig", memory_bytes=80 * GiB)
    first, second = node.spec.gpus
    first = replace(first, mig_mode=True, mig=mig_instances(first.uuid, PROFILES))
    node.update(replace(node.spec, gpus=(first, second)))
    return node


# NVML's view of every GPU and of its MIG devices, through unmodified pynvml.
LIST_NVML = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    current, pending = pynvml.nvmlDeviceGetMigMode(h)
    gpu = {"mode": [int(current), int(pending)], "max": int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)),
           "is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(h).value, "instances": []}
    for k in range(gpu["max"]):
        try:
            m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except pynvml.NVMLError_NotFound:
            gpu["instances"].append(None)
            continue
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        gpu["instances"].append({
            "name": pynvml.nvmlDeviceGetName(m), "uuid": pynvml.nvmlDeviceGetUUID(m),
            "memory": pynvml.nvmlDeviceGetMemoryInfo(m).total,
            "is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(m).value,
            "parent": pynvml.nvmlDeviceGetUUID(parent),
            "gi": int(pynvml.nvmlDeviceGetGpuInstanceId(m)),
            "ci": int(pynvml.nvmlDeviceGetComputeInstanceId(m)),
        })
    out.append(gpu)
print(json.dumps(out))
"""


def test_nvml_lists_the_instances_of_a_gpu_in_mig_mode(mig_node: Node) -> None:
    """GPU 0 reports MIG mode on (current and pending), room for 7 MIG devices of which slots 0 and
    1 hold the configured instances, named as NVIDIA names them, with their own UUID and memory
    and their parent; GPU 1 reports MIG off and no MIG devices."""
    seen = mig_node.python_json(LIST_NVML)
    assert isinstance(seen, list)
    first, second = seen
    gpu = mig_node.spec.gpus[0]
    assert first["mode"] == [1, 1] and first["max"] == 7 and first["is_mig"] == 0
    assert first["instances"][2:] == [None] * 5
    for got, want, gi in zip(first["instances"][:2], gpu.mig, (1, 2), strict=True):
        assert got == {
            "name": f"NVIDIA H100 80GB HBM3 MIG {want.profile}",
            "uuid": want.uuid,
            "memory": want.memory_bytes,
            "is_mig": 1,
            "parent": gpu.uuid,
            "gi": gi,
            "ci": 0,
        }
    assert second == {"mode": [0, 0], "max": 0, "is_mig": 0, "instances": []}


def test_mig_mode_is_not_supported_before_ampere(make_node: NodeFactory) -> None:
    """A Volta-class GPU (compute capability 7.0) answers NVML_ERROR_NOT_SUPPORTED, as real ones do."""
    node = make_node(gpus=1, name="volta")
    node.update(replace(node.spec, gpus=(replace(node.spec.gpus[0], compute_capability=(7, 0)),)))
    done = node.python(
        """
import pynvml
pynvml.nvmlInit()
try:
    pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0))
except pynvml.NVMLError_NotSupported:
    print("not supported")
"""
    )
    assert done.stdout.strip() == "not supported", done.stderr


# CUDA's view: cuInit, then per ordinal the name, total memory, both UUID versions, cuMemGetInfo,
# and whether an allocation of ALLOC bytes succeeds.
CUDA_VIEW = """
import ctypes, json, os
cu = ctypes.CDLL("libcuda.so.1")
out = {"init": cu.cuInit(0), "devices": []}
count = ctypes.c_int(0)
if out["init"] == 0:
    assert cu.cuDeviceGetCount(ctypes.byref(count)) == 0
def uuid(fn, i):
    raw = (ctypes.c_ubyte * 16)()
    assert fn(raw, i) == 0
    h = bytes(raw).hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
for i in range(count.value):
    name = ctypes.create_string_buffer(128)
    total = ctypes.c_size_t()
    assert cu.cuDeviceGetName(name, 128, i) == 0
    assert cu.cuDeviceTotalMem_v2(ctypes.byref(total), i) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, i) == 0
    free, whole = ctypes.c_size_t(), ctypes.c_size_t()
    assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(whole)) == 0
    ptr = ctypes.c_uint64()
    alloc = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(os.environ["ALLOC"])))
    out["devices"].append(dict(name=name.value.decode(), total=total.value, v1=uuid(cu.cuDeviceGetUuid, i),
                               v2=uuid(cu.cuDeviceGetUuid_v2, i), free=free.value, whole=whole.value,
                               alloc=alloc))
print(json.dumps(out))
"""


def cuda_view(node: Node, visible: str | None, alloc: int = MiB) -> dict[str, Any]:
    env = {"ALLOC": str(alloc)}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    seen = node.python_json(CUDA_VIEW, env=env)
    assert isinstance(seen, dict)
    return seen


def test_cuda_shows_an_instance_named_by_its_mig_uuid(mig_node: Node) -> None:
    """CUDA_VISIBLE_DEVICES=MIG-<uuid> shows one device: the instance's name, its memory as the
    total (cuDeviceTotalMem and cuMemGetInfo), the instance's UUID from cuDeviceGetUuid_v2 and its
    GPU's from v1; an allocation of its whole memory fits and one byte more does not."""
    gpu = mig_node.spec.gpus[0]
    instance = gpu.mig[1]
    seen = cuda_view(mig_node, instance.uuid, alloc=instance.memory_bytes)
    assert seen["init"] == 0
    (device,) = seen["devices"]
    assert device == {
        "name": "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        "total": instance.memory_bytes,
        "v1": gpu.uuid[4:],
        "v2": instance.uuid[4:],
        "free": instance.memory_bytes,
        "whole": instance.memory_bytes,
        "alloc": 0,
    }
    (over,) = cuda_view(mig_node, instance.uuid, alloc=instance.memory_bytes + 1)["devices"]
    assert over["alloc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY


def test_instances_account_their_memory_apart(mig_node: Node) -> None:
    """Memory held on one instance is in use there (NVML on its MIG handle, cuMemGetInfo in another
    process on it) and nowhere else: not on the other instance, not on the other GPU."""
    gpu = mig_node.spec.gpus[0]
    holder = mig_node.start(
        "simgpu_probe", "alloc", "0", str(256 * MiB), "1", env={"CUDA_VISIBLE_DEVICES": gpu.mig[0].uuid}
    )
    try:
        read_line(holder, "holding")
        (same,) = cuda_view(mig_node, gpu.mig[0].uuid)["devices"]
        (other,) = cuda_view(mig_node, gpu.mig[1].uuid)["devices"]
        assert same["free"] == gpu.mig[0].memory_bytes - 256 * MiB
        assert other["free"] == gpu.mig[1].memory_bytes
        used = mig_node.python_json(
            """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k) for k in (0, 1)]
whole = pynvml.nvmlDeviceGetHandleByIndex(1)
print(json.dumps([pynvml.nvmlDeviceGetMemoryInfo(m).used for m in (*migs, whole)]))
"""
        )
        assert used == [256 * MiB, 0, 0]
    finally:
        release(holder)


@pytest.mark.parametrize("visible", [None, "0", "GPU-"])
def test_a_gpu_in_mig_mode_is_not_usable_whole(mig_node: Node, visible: str | None) -> None:
    """Unset, CUDA shows only GPU 1; GPU 0 named by index or UUID names nothing (the list ends
    there, so CUDA finds no device)."""
    if visible == "GPU-":
        visible = mig_node.spec.gpus[0].uuid
    seen = cuda_view(mig_node, visible)
    if visible is None:
        assert [d["v1"] for d in seen["devices"]] == [mig_node.spec.gpus[1].uuid[4:]]
    else:
        assert seen["init"] == 100  # CUDA_ERROR_NO_DEVICE


def test_an_instance_of_a_gpu_not_in_mig_mode_names_nothing(mig_node: Node) -> None:
    """With MIG off, the configured instances do not exist: their UUIDs name no device."""
    first, second = mig_node.spec.gpus
    mig_node.update(replace(mig_node.spec, gpus=(replace(first, mig_mode=False), second)))
    assert cuda_view(mig_node, first.mig[0].uuid)["init"] == 100
    assert len(cuda_view(mig_node, None)["devices"]) == 2


WATCH_MODE = """
import pynvml, sys
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
print("MODE", pynvml.nvmlDeviceGetMigMode(h)[0], flush=True)
sys.stdin.readline()
print("MODE", pynvml.nvmlDeviceGetMigMode(h)[0], flush=True)
try:
    pynvml.nvmlDeviceGetName(m)
except pynvml.NVMLError_NotFound:
    print("GONE", flush=True)
"""


def test_mode_switch_reaches_a_running_process(mig_node: Node) -> None:
    """A process that found GPU 0 in MIG mode sees it switched off once the configuration is
    rewritten, and the MIG device handle it held then names nothing."""
    import subprocess
    import sys

    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCH_MODE],
        env=mig_node.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_line(watcher, "MODE") == "MODE 1"
        first, second = mig_node.spec.gpus
        mig_node.update(replace(mig_node.spec, gpus=(replace(first, mig_mode=False), second)))
        time.sleep(0.1)  # past the 20 ms poll: the process must look at the file again
        assert watcher.stdin is not None
        watcher.stdin.write("\n")
        watcher.stdin.flush()
        assert read_line(watcher, "MODE") == "MODE 0"
        assert read_line(watcher, "GONE") == "GONE"
    finally:
        watcher.kill()
        watcher.wait()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mig]\nprofile = 1g.10gb\n", "[mig] before any [gpu]"),
        ("[gpu]\n[mig]\nprofile = big\n", "profile: expected a MIG profile such as 1g.10gb, got 'big'"),
        ("[gpu]\n[mig]\nuuid = GPU-00000000-0000-0000-0000-000000000000\n", "uuid: expected MIG-"),
        ("[gpu]\n[mig]\nmemory_bytes = 2147483649\n", "memory_bytes: 2147483649 is outside"),
        ("[gpu]\n[mig]\nprofile = 1g.1gb\n", "[mig] of GPU #0 lacks required key 'uuid'"),
        ("[gpu]\n[mig]\nbogus = 1\n", "unknown key 'bogus' in [mig]"),
    ],
)
def test_bad_mig_sections_are_refused(make_node: NodeFactory, text: str, message: str) -> None:
    """A [mig] section is checked like the rest: placement, profile, UUID form, memory within its
    GPU's, required keys, unknown keys; libcuda refuses to start and says so, naming the file."""
    node = make_node(memory_bytes=2 * GiB)
    gpu = node.spec.gpus[0]
    head = f"[node]\nstate_file = {node.spec.state_file}\n"
    whole = f"[gpu]\nuuid = {gpu.uuid}\nname = x\nmemory_bytes = {2 * GiB}\n"
    node.config.write_text(head + text.replace("[gpu]\n", whole))
    done = node.python("import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))")
    assert done.stdout.split() == ["999"]
    assert f"simgpu: {node.config}:" in done.stderr and message in done.stderr


def test_instances_beyond_their_gpu_are_refused(make_node: NodeFactory) -> None:
    """Instances whose memory adds up to more than their GPU's, or that share a UUID, are refused."""
    node = make_node(memory_bytes=2 * GiB)
    uuid = "MIG-00000000-0000-0000-0000-000000000001"
    section = f"[mig]\nprofile = 1g.1gb\nuuid = {uuid}\nmemory_bytes = {GiB + 1}\n"
    node.config.write_text(node.config.read_text() + section + section.replace("0001\n", "0002\n"))
    done = node.python("import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))")
    assert "its [mig] instances' memory" in done.stderr
    node.config.write_text(
        node.config.read_text().replace(str(GiB + 1), str(GiB)).replace("0002\n", "0001\n")
    )
    done = node.python("import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))")
    assert f"MIG instances share uuid {uuid}" in done.stderr


def test_more_than_seven_instances_are_refused(make_node: NodeFactory) -> None:
    """A GPU holds at most 7 MIG instances, as an A100 or H100 does."""
    node = make_node(memory_bytes=8 * GiB)
    sections = "".join(
        f"[mig]\nprofile = 1g.1gb\nuuid = MIG-00000000-0000-0000-0000-00000000000{i}\nmemory_bytes = {GiB}\n"
        for i in range(8)
    )
    node.config.write_text(node.config.read_text() + sections)
    done = node.python("import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))")
    assert done.stdout.split() == ["999"]
    assert "more than 7 [mig] sections for GPU #0" in done.stderr
