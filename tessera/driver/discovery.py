"""What GPUs this node has, whether each still answers, and what it is doing: the only module that
calls NVML.

Everything else works on the plain records returned here, so the device model, the slices and the
tests never touch pynvml, and the real and the simulated driver are read by the same calls.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pynvml

log = logging.getLogger(__name__)

T = TypeVar("T")

_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
_BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}


MIG_PROFILE = re.compile(r"[1-8]g\.[0-9]+gb(\+[a-z0-9]+)*|[1-8]c\.[1-8]g\.[0-9]+gb(\+[a-z0-9]+)*")
"""NVIDIA's MIG profile names ("1g.10gb", "1g.10gb+me", "1c.2g.20gb"): what NVML's name of a MIG
device ends with, and what a HAMi user writes after nvidia.com/mig-."""

_MIG_NAME_SEPARATOR = " MIG "


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU in MIG mode (a GPU instance with a compute instance in it), as
    NVML lists it under its parent."""

    uuid: str
    """"MIG-..." as NVML gives it; what CUDA_VISIBLE_DEVICES names it by."""
    profile: str
    memory_bytes: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    memory_bytes: int
    cuda_compute_capability: tuple[int, int]
    driver_version: str
    cuda_driver_version: int
    """As NVML gives it: 12040 is CUDA 12.4."""
    pci_bus_id: str
    minor_number: int
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...] = ()
    """Its MIG instances while it is in MIG mode (then the GPU itself is not shareable)."""


@dataclass(frozen=True)
class GpuSample:
    """What one GPU reports now, for the exporter. A field is None where NVML does not give it
    (the query is not supported on this GPU or failed), so one missing sensor loses one series."""

    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_percent: int | None
    temperature_celsius: int | None
    power_milliwatts: int | None
    process_sm_percent: dict[int, int] | None
    """SM utilisation over NVML's last sample window, by process ID as this process sees it
    (the host's, when the daemon runs in the host's PID namespace); None when the driver gives no
    per-process samples, empty when no process ran a kernel in the window."""
    compute_memory: dict[int, int | None] | None = None
    """Processes with a compute context on the GPU now (same PID view) -> the device memory the
    driver says each holds there (NVML's usedGpuMemory, contexts of one process added), None for
    a process whose figure the driver does not give. What the driver counts, whether or not the
    process went through the shim: the exporter holds it against what the shim charged. None when
    NVML cannot list the processes."""


class Nvml:
    """An initialised NVML, shared by discovery and the health poller (NVML is process-global;
    one init, one shutdown).

    Calls about one GPU are serialised by that GPU's own lock, never by one lock for all: a call
    wedged on one GPU (a stuck driver) must not hold up the calls about the others, which the
    exporter's per-GPU watchdog (tessera/exporter/watched_nvml.py) relies on. NVML itself is
    thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        """Held while listing every GPU."""
        self._guard = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = {}
        pynvml.nvmlInit()

    def _lock_of(self, uuid: str) -> threading.Lock:
        """GPU ``uuid``'s own lock."""
        with self._guard:
            return self._gpu_locks.setdefault(uuid, threading.Lock())

    def close(self) -> None:
        pynvml.nvmlShutdown()

    def gpus(self) -> list[Gpu]:
        """Every GPU NVML lists, in NVML's index order."""
        with self._lock:
            return [self.gpu_at(i) for i in range(self.gpu_count())]

    def gpu_count(self) -> int:
        """How many GPUs NVML lists (a system query: no GPU is asked)."""
        return int(pynvml.nvmlDeviceGetCount())

    def gpu_at(self, index: int) -> Gpu:
        """The GPU at NVML index ``index``. The exporter asks one GPU at a time, each under its
        watchdog, so that one whose NVML hangs costs only itself."""
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        mig_enabled = _mig_enabled(handle)
        return Gpu(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            product_name=_text(pynvml.nvmlDeviceGetName(handle)),
            brand=_BRANDS.get(int(pynvml.nvmlDeviceGetBrand(handle)), "Unknown"),
            architecture=_ARCHITECTURES.get(int(pynvml.nvmlDeviceGetArchitecture(handle)), "Unknown"),
            memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            cuda_compute_capability=(int(major), int(minor)),
            driver_version=driver,
            cuda_driver_version=cuda,
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            minor_number=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
            mig_enabled=mig_enabled,
            mig_devices=_mig_devices(handle) if mig_enabled else (),
        )

    def mig_layout(self, uuid: str) -> tuple[bool, tuple[MigDevice, ...]] | None:
        """Whether GPU ``uuid`` is in MIG mode now and its instances; None when NVML cannot say
        (a lost GPU: its health says so). An operator may switch the mode while the daemon runs;
        the health poll asks this to notice."""
        with self._lock_of(uuid):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                enabled = _mig_enabled(handle)
                return enabled, _mig_devices(handle) if enabled else ()
            except pynvml.NVMLError as error:
                log.debug("cannot read the MIG layout of GPU %s: %s", uuid, error)
                return None

    def problem(self, uuid: str) -> str | None:
        """NVML's reason the GPU ``uuid`` cannot be used now ("GPU is lost"), or None if it answers.

        A lost GPU fails its handle lookup or its first query."""
        with self._lock_of(uuid):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as error:
                return str(error)
        return None

    def sample(self, uuid: str) -> GpuSample:
        """Memory, utilisation, temperature, power and per-process SM utilisation of GPU ``uuid``
        (pynvml.NVMLError if the GPU cannot be found at all)."""
        with self._lock_of(uuid):
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            memory = _optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
            utilization = _optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
            return GpuSample(
                memory_total_bytes=None if memory is None else int(memory.total),
                memory_used_bytes=None if memory is None else int(memory.used),
                utilization_percent=None if utilization is None else int(utilization.gpu),
                temperature_celsius=_optional(
                    lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
                ),
                power_milliwatts=_optional(lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle))),
                process_sm_percent=_process_samples(handle),
                compute_memory=_compute_memory(handle),
            )

    def compute_memory(self, uuid: str) -> dict[int, int | None] | None:
        """Only :attr:`GpuSample.compute_memory` of GPU ``uuid``: one NVML call, for a check that runs
        several times a second (pynvml.NVMLError if the GPU cannot be found at all)."""
        with self._lock_of(uuid):
            return _compute_memory(pynvml.nvmlDeviceGetHandleByUUID(uuid))


def _optional(query: Callable[[], T]) -> T | None:
    try:
        return query()
    except pynvml.NVMLError:
        return None


def _compute_memory(handle: object) -> dict[int, int | None] | None:
    """pynvml gives usedGpuMemory as None where the driver reports it not available (as under
    some virtualisation); one such context makes its process's figure unknown, not 0."""
    try:
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError:
        return None
    out: dict[int, int | None] = {}
    for process in listed:
        pid, used = int(process.pid), process.usedGpuMemory
        before = out.get(pid, 0)
        out[pid] = None if used is None or (pid in out and before is None) else (before or 0) + int(used)
    return out


def _process_samples(handle: object) -> dict[int, int] | None:
    """Per-process SM utilisation over the driver's sample window (timestamp 0: the whole window).
    NVML answers NOT_FOUND when no process ran a kernel in it: that is an empty sample, not a
    failure. Two samples of one process (several contexts) are added."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    except pynvml.NVMLError_NotFound:
        return {}
    except pynvml.NVMLError:
        return None
    out: dict[int, int] = {}
    for sample in samples:
        out[int(sample.pid)] = out.get(int(sample.pid), 0) + int(sample.smUtil)
    return out


def _mig_enabled(handle: object) -> bool:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # not supported on this GPU: no MIG
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _mig_devices(handle: object) -> tuple[MigDevice, ...]:
    """The MIG devices under a GPU in MIG mode, in NVML's order. NVML numbers slots up to the
    GPU's maximum and answers NOT_FOUND for an empty one. A device whose name carries no profile
    NVIDIA uses is logged and left out: nothing could ask for it by profile."""
    out = []
    for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue
        name = _text(pynvml.nvmlDeviceGetName(mig))
        uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
        profile = name.rpartition(_MIG_NAME_SEPARATOR)[2]
        if _MIG_NAME_SEPARATOR not in name or not MIG_PROFILE.fullmatch(profile):
            log.warning(
                "MIG device %s is named %r, which ends in no MIG profile; not publishing it", uuid, name
            )
            continue
        out.append(
            MigDevice(
                uuid=uuid,
                profile=profile,
                memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(mig).total),
                gpu_instance_id=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
            )
        )
    return tuple(out)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
