"""What GPUs this node has and whether each still answers: the only module that calls NVML.

Everything else works on the plain records returned here, so the device model, the slices and the
tests never touch pynvml, and the real and the simulated driver are read by the same calls.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import pynvml

log = logging.getLogger(__name__)

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


class Nvml:
    """An initialised NVML, shared by discovery and the health poller (NVML is process-global;
    one init, one shutdown)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        pynvml.nvmlInit()

    def close(self) -> None:
        pynvml.nvmlShutdown()

    def gpus(self) -> list[Gpu]:
        """Every GPU NVML lists, in NVML's index order."""
        with self._lock:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
            return [self._gpu(i, driver, cuda) for i in range(pynvml.nvmlDeviceGetCount())]

    def _gpu(self, index: int, driver: str, cuda: int) -> Gpu:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
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
            mig_enabled=_mig_enabled(handle),
        )

    def problem(self, uuid: str) -> str | None:
        """NVML's reason the GPU ``uuid`` cannot be used now ("GPU is lost"), or None if it answers.

        A lost GPU fails its handle lookup or its first query."""
        with self._lock:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as error:
                return str(error)
        return None


def _mig_enabled(handle: object) -> bool:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # not supported on this GPU: no MIG
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
