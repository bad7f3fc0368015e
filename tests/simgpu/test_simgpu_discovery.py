"""pynvml, unmodified, sees a simulated node exactly as configured; bad configurations are refused."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from simgpu.config import GiB, GpuSpec, NodeSpec, write_config
from simgpu.node import NodeFactory, read_line

LIST_GPUS = """
import json, pynvml as n
n.nvmlInit()
gpus = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    pci = n.nvmlDeviceGetPciInfo(h)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    mem2 = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
    gpus.append(dict(
        index=n.nvmlDeviceGetIndex(h), name=n.nvmlDeviceGetName(h), uuid=n.nvmlDeviceGetUUID(h),
        total=mem.total, total_v2=mem2.total, free=mem.free, pci=pci.busId,
        pci_device_id=pci.pciDeviceId, minor=n.nvmlDeviceGetMinorNumber(h),
        cc=list(n.nvmlDeviceGetCudaComputeCapability(h)), brand=n.nvmlDeviceGetBrand(h),
        arch=n.nvmlDeviceGetArchitecture(h), temp=n.nvmlDeviceGetTemperature(h, 0),
        power=n.nvmlDeviceGetPowerUsage(h), limit=n.nvmlDeviceGetEnforcedPowerLimit(h),
        by_uuid=n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h))),
        by_pci=n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(pci.busId)),
    ))
print(json.dumps(dict(driver=n.nvmlSystemGetDriverVersion(),
                      cuda=n.nvmlSystemGetCudaDriverVersion(), gpus=gpus)))
n.nvmlShutdown()
"""


def test_pynvml_lists_configured_gpus(make_node: NodeFactory) -> None:
    """pynvml lists every configured GPU with its configured name, UUID, memory, PCI bus id,
    minor number, compute capability, brand and architecture, and the driver versions."""
    node = make_node(gpus=2, name="disc", driver_version="535.104.05", cuda_driver_version=12020)
    a100 = replace(
        node.spec.gpus[1],
        name="NVIDIA A100-SXM4-40GB",
        memory_bytes=40 * GiB,
        sm_count=108,
        compute_capability=(8, 0),
        pci_bus_id="00000000:3B:00.0",
        minor=7,
        brand="tesla",
        pci_device_id=0x20B010DE,
    )
    node.update(replace(node.spec, gpus=(node.spec.gpus[0], a100)))
    seen = node.python_json(LIST_GPUS)
    assert isinstance(seen, dict)
    assert seen["driver"] == "535.104.05"
    assert seen["cuda"] == 12020
    for i, (got, want) in enumerate(zip(seen["gpus"], node.spec.gpus, strict=True)):
        assert got["index"] == got["by_uuid"] == got["by_pci"] == i
        assert got["name"] == want.name
        assert got["uuid"] == want.uuid
        assert got["total"] == got["total_v2"] == got["free"] == want.memory_bytes
        assert got["pci"] == want.pci_bus_id
        assert got["pci_device_id"] == want.pci_device_id
        assert got["minor"] == want.minor
        assert tuple(got["cc"]) == want.compute_capability
        assert got["temp"] == want.temperature_c
        assert got["power"] == want.power_watts * 1000
        assert got["limit"] == want.power_limit_watts * 1000
    assert [g["brand"] for g in seen["gpus"]] == [14, 2]  # NVML_BRAND_NVIDIA, NVML_BRAND_TESLA
    assert [g["arch"] for g in seen["gpus"]] == [9, 7]  # Hopper, Ampere


def test_cuda_sees_configured_gpus(make_node: NodeFactory) -> None:
    """The CUDA driver API reports the same GPUs: count, name, memory, SM count, compute
    capability and the UUID's 16 bytes."""
    node = make_node(gpus=2, name="cuda", memory_bytes=3 * GiB)
    seen = node.python_json(
        """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
n = ctypes.c_int()
cu.cuDeviceGetCount(ctypes.byref(n))
out = []
for d in range(n.value):
    name = ctypes.create_string_buffer(100)
    mem = ctypes.c_size_t()
    sm, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    uuid = (ctypes.c_char * 16)()
    cu.cuDeviceGetName(name, 100, d)
    cu.cuDeviceTotalMem_v2(ctypes.byref(mem), d)
    cu.cuDeviceGetAttribute(ctypes.byref(sm), 16, d)
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, d)
    cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, d)
    cu.cuDeviceGetUuid(uuid, d)
    out.append([name.value.decode(), mem.value, sm.value, major.value, minor.value,
                bytes(uuid).hex()])
print(json.dumps(out))
"""
    )
    assert isinstance(seen, list)
    for got, want in zip(seen, node.spec.gpus, strict=True):
        assert got[:5] == [want.name, want.memory_bytes, want.sm_count, *want.compute_capability]
        assert got[5] == want.uuid[4:].replace("-", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[node]\nstate_file = /tmp/x\nbogus = 1\n", ":3: unknown key 'bogus' in [node]"),
        ("[node]\nstate_file = /tmp/x\n[gpu]\nuuid = GPU-1\n", ":4: uuid: expected GPU-"),
        ("[node]\nstate_file = /tmp/x\n[gpu]\nname = x\n", ":4: [gpu] #0 lacks required key 'uuid'"),
        ("[node]\nstate_file = relative\n", ":2: state_file: must be an absolute path"),
        ("[node]\nstate_file = /tmp/x\nstate_file = /tmp/y\n", ":3: duplicate key 'state_file'"),
        ("[node]\nstate_file = /tmp/x\njust words\n", ":3: expected 'key = value'"),
        ("[nodes]\n", ":1: unknown section [nodes]"),
        ("[node]\nutil_window_ms = -5\nstate_file = /tmp/x\n", ":2: util_window_ms: expected"),
        ("[node]\n", ": [node] state_file is required"),
        ("[kernels]\nk = soon\n[node]\nstate_file = /tmp/x\n", ":2: k: expected 'param0'"),
    ],
)
def test_bad_configuration_is_refused_with_file_and_line(
    make_node: NodeFactory, text: str, message: str
) -> None:
    """A malformed configuration makes cuInit fail with CUDA_ERROR_UNKNOWN and nvmlInit with
    NVML_ERROR_UNKNOWN, and the message on stderr names the file, the line and the problem."""
    node = make_node()
    node.config.write_text(text)
    done = node.python(
        """
import ctypes, pynvml
print(ctypes.CDLL("libcuda.so.1").cuInit(0))
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as e:
    print(e.value)
"""
    )
    assert done.stdout.split() == ["999", "999"]
    assert f"simgpu: {node.config}{message}" in done.stderr


def test_without_configuration_there_is_no_gpu(make_node: NodeFactory) -> None:
    """Without $SIMGPU_CONFIG the libraries behave like NVIDIA's on a machine without a GPU:
    cuInit returns CUDA_ERROR_NO_DEVICE and nvmlInit NVML_ERROR_DRIVER_NOT_LOADED."""
    node = make_node()
    env = node.env
    del env["SIMGPU_CONFIG"]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, pynvml\nprint(ctypes.CDLL('libcuda.so.1').cuInit(0))\n"
            "try:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n    print(e.value)\n",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["100", "9"]


def test_nodes_on_one_machine_are_independent(make_node: NodeFactory) -> None:
    """Two simulated nodes with their own configurations and state files share nothing: memory
    held on one does not appear on the other."""
    a = make_node(name="a")
    b = make_node(name="b", memory_bytes=2 * GiB)
    holder = a.start("simgpu_probe", "alloc", "0", str(512 << 20), "1")
    try:
        read_line(holder, "holding")
        used = (
            "import json,pynvml as n\nn.nvmlInit()\nh=n.nvmlDeviceGetHandleByIndex(0)\n"
            "m=n.nvmlDeviceGetMemoryInfo(h)\nprint(json.dumps([m.used, m.total]))"
        )
        assert a.python_json(used) == [512 << 20, GiB]
        assert b.python_json(used) == [0, 2 * GiB]
    finally:
        holder.kill()
        holder.wait()


def test_topology_change_with_live_processes_is_refused(make_node: NodeFactory) -> None:
    """A state file in use cannot be taken over by a configuration with different GPUs: the new
    process fails to initialise with a message saying so, and the running one is unaffected."""
    node = make_node(name="topo")
    holder = node.start("simgpu_probe", "alloc", "0", "4096", "1")
    try:
        read_line(holder, "holding")
        bigger = replace(node.spec, gpus=(*node.spec.gpus, _second_gpu(node.spec)))
        other = node.config.with_name("other.conf")
        write_config(bigger, other)
        env = node.env
        env["SIMGPU_CONFIG"] = str(other)
        done = subprocess.run(
            [sys.executable, "-c", "import ctypes;print(ctypes.CDLL('libcuda.so.1').cuInit(0))"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == "999"
        assert "in use by processes started with a different GPU configuration" in done.stderr
    finally:
        holder.kill()
        holder.wait()


def _second_gpu(spec: NodeSpec) -> GpuSpec:
    return replace(spec.gpus[0], uuid=spec.gpus[0].uuid[:-1] + "0", pci_bus_id="00000000:09:00.0", minor=9)


def test_the_driver_publishes_a_cuda13_node_s_versions(make_node: NodeFactory) -> None:
    """End to end from the configuration file to the DRA device: on a node configured with
    driver 580.65.06 and CUDA 13.0, the Tessera driver's NVML discovery reads both, and the device
    it publishes carries them as the semantic versions DRA requires (580.65.6, 13.0.0)."""
    node = make_node(name="cuda13", driver_version="580.65.06", cuda_driver_version=13000)
    seen = node.python_json(
        """
import json
from tessera.driver.devices import device
from tessera.driver.discovery import Nvml
nvml = Nvml()
gpu = nvml.gpus()[0]
attributes = device(gpu)["attributes"]
print(json.dumps([gpu.driver_version, gpu.cuda_driver_version,
                  attributes["driverVersion"], attributes["cudaDriverVersion"]]))
nvml.close()
"""
    )
    assert seen == ["580.65.06", 13000, {"version": "580.65.6"}, {"version": "13.0.0"}]
