"""Configure simulated GPU nodes: write a node's configuration and give processes its environment.

A simulated node is a configuration file plus a state file. Every process started with the
environment from :func:`process_env` loads the simulated ``libcuda.so.1`` and
``libnvidia-ml.so.1`` exactly as it would load NVIDIA's, and sees the node's GPUs. Nodes with
different configuration files are independent, so one machine can host several. The file format
is described in docs/simgpu.md.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from tessera.files import write_atomically

CONFIG_ENV = "SIMGPU_CONFIG"
LIB_DIR_ENV = "TESSERA_SIMGPU_LIB_DIR"

GiB = 1 << 30

KernelDuration = int | Literal["param0"]
"""How long a kernel occupies the GPU: nanoseconds, or "param0" for its first parameter."""

SLEEP_KERNEL = "simgpu_sleep_ns"
"""The test programs' kernel: it runs for as many nanoseconds as its first parameter says."""

BRANDS = ("quadro", "tesla", "nvs", "geforce", "titan", "nvidia_rtx", "nvidia")


@dataclass(frozen=True)
class GpuFaults:
    """Faults a running process picks up when the configuration file is rewritten."""

    fail_alloc: int = 0
    """Each process's Nth device allocation on this GPU fails with out-of-memory; 0 = never."""
    lost: bool = False
    """The GPU has fallen off the bus: CUDA and NVML calls that touch it fail."""
    nvml_hang: bool = False
    """NVML calls that touch the GPU (its handle lookups and queries) block until this is cleared."""


@dataclass(frozen=True)
class MigInstance:
    """One MIG instance of a GPU (a GPU instance holding one compute instance)."""

    profile: str
    """NVIDIA's profile name, "1g.10gb": NVML names the instance "<GPU name> MIG <profile>"."""
    uuid: str
    """MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"""
    memory_bytes: int


def mig_uuid(gpu: str, index: int) -> str:
    """A stable UUID for MIG instance ``index`` of the GPU with UUID ``gpu``, in NVIDIA's form."""
    digest = hashlib.sha256(f"{gpu}/mig/{index}".encode()).hexdigest()
    return f"MIG-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def mig_instances(gpu_uuid: str, profiles: tuple[tuple[str, int], ...]) -> tuple[MigInstance, ...]:
    """Instances of the GPU ``gpu_uuid`` from (profile, memory bytes) pairs, with stable UUIDs."""
    return tuple(MigInstance(p, mig_uuid(gpu_uuid, i), m) for i, (p, m) in enumerate(profiles))


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU (defaults describe an H100 SXM)."""

    uuid: str
    pci_bus_id: str
    minor: int
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 80 * GiB
    sm_count: int = 132
    compute_capability: tuple[int, int] = (9, 0)
    brand: str = "nvidia"
    pci_device_id: int = 0x233010DE
    power_watts: int = 70
    power_limit_watts: int = 700
    temperature_c: int = 35
    faults: GpuFaults = field(default_factory=GpuFaults)
    mig_mode: bool = False
    """In MIG mode, the GPU's ``mig`` instances exist and the GPU is no longer usable whole; a
    running process picks a change up like a fault."""
    mig: tuple[MigInstance, ...] = ()
    """The GPU's MIG instances (at most 7), fixed for running processes like the rest of the GPU."""

    def __post_init__(self) -> None:
        if len(self.mig) > 7 or sum(m.memory_bytes for m in self.mig) > self.memory_bytes:
            raise ValueError("at most 7 MIG instances, together no more memory than the GPU")
        if self.brand not in BRANDS:
            raise ValueError(f"brand must be one of {BRANDS}, got {self.brand!r}")
        if self.memory_bytes <= 0 or self.sm_count <= 0:
            raise ValueError("memory_bytes and sm_count must be positive")


@dataclass(frozen=True)
class NodeSpec:
    """A simulated node: its GPUs, driver versions, timing and where its shared state lives."""

    state_file: Path
    gpus: tuple[GpuSpec, ...]
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    util_window_ms: int = 1000
    default_kernel_ns: int = 100_000
    latency_us: int = 0
    kernels: Mapping[str, KernelDuration] = field(default_factory=lambda: {SLEEP_KERNEL: "param0"})

    def __post_init__(self) -> None:
        if not self.state_file.is_absolute():
            raise ValueError(f"state_file must be absolute, got {self.state_file}")


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID for GPU ``index`` of node ``node``, in NVIDIA's GPU-8-4-4-4-12 form."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def make_gpus(count: int, node: str = "node0", **overrides: object) -> tuple[GpuSpec, ...]:
    """``count`` GPUs with distinct UUIDs, PCI bus ids and minor numbers; ``overrides`` apply to
    every GPU (for example ``memory_bytes=16 * GiB``)."""
    gpus = []
    for i in range(count):
        gpu = GpuSpec(uuid=gpu_uuid(node, i), pci_bus_id=f"00000000:{i + 1:02X}:00.0", minor=i)
        gpus.append(replace(gpu, **overrides))  # type: ignore[arg-type]
    return tuple(gpus)


def render(spec: NodeSpec) -> str:
    """The configuration file's text for ``spec``."""
    lines = [
        "# Simulated NVIDIA node (Tessera simgpu); format: docs/simgpu.md",
        "[node]",
        f"state_file = {spec.state_file}",
        f"driver_version = {spec.driver_version}",
        f"cuda_driver_version = {spec.cuda_driver_version}",
        f"util_window_ms = {spec.util_window_ms}",
        f"default_kernel_ns = {spec.default_kernel_ns}",
        f"latency_us = {spec.latency_us}",
    ]
    for gpu in spec.gpus:
        major, minor = gpu.compute_capability
        lines += [
            "",
            "[gpu]",
            f"uuid = {gpu.uuid}",
            f"name = {gpu.name}",
            f"memory_bytes = {gpu.memory_bytes}",
            f"sm_count = {gpu.sm_count}",
            f"compute_capability = {major}.{minor}",
            f"pci_bus_id = {gpu.pci_bus_id}",
            f"pci_device_id = {gpu.pci_device_id:#010x}",
            f"minor = {gpu.minor}",
            f"brand = {gpu.brand}",
            f"power_watts = {gpu.power_watts}",
            f"power_limit_watts = {gpu.power_limit_watts}",
            f"temperature_c = {gpu.temperature_c}",
            f"fail_alloc = {gpu.faults.fail_alloc}",
            f"lost = {'true' if gpu.faults.lost else 'false'}",
            f"nvml_hang = {'true' if gpu.faults.nvml_hang else 'false'}",
            f"mig_mode = {'true' if gpu.mig_mode else 'false'}",
        ]
        for instance in gpu.mig:
            lines += [
                "",
                "[mig]",
                f"profile = {instance.profile}",
                f"uuid = {instance.uuid}",
                f"memory_bytes = {instance.memory_bytes}",
            ]
    if spec.kernels:
        lines += ["", "[kernels]"]
        lines += [f"{name} = {duration}" for name, duration in spec.kernels.items()]
    return "\n".join(lines) + "\n"


def write_config(spec: NodeSpec, path: Path) -> Path:
    """Write ``spec`` to ``path`` atomically (running processes re-read faults from it, and must
    never see half a file). Returns ``path``."""
    return write_atomically(path, render(spec))


def library_dir() -> Path:
    """Where the simulated libraries are: $TESSERA_SIMGPU_LIB_DIR, else the source tree's
    build/simgpu (built by ``make -C simgpu``)."""
    override = os.environ.get(LIB_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "build" / "simgpu"


def process_env(config: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a process on the node configured by ``config``: ``base`` (default:
    this process's environment) with the config named and the simulated libraries first on the
    library path."""
    env = dict(os.environ if base is None else base)
    env[CONFIG_ENV] = str(config)
    search = [str(library_dir())]
    if env.get("LD_LIBRARY_PATH"):
        search.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(search)
    return env
