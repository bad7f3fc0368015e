"""Driver unit-test inputs: GPU records and ResourceClaims shaped as the API returns them."""

from __future__ import annotations

from typing import Any

from tessera.driver.discovery import Gpu
from tessera.names import DRIVER_NAME
from tessera.quantity import GiB


def gpu(index: int = 0, memory_bytes: int = 80 * GiB, uuid: str | None = None) -> Gpu:
    return Gpu(
        index=index,
        uuid=uuid or f"GPU-{index:08x}-1111-2222-3333-444455556666",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        memory_bytes=memory_bytes,
        cuda_compute_capability=(9, 0),
        driver_version="550.54.15",
        cuda_driver_version=12040,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        minor_number=index,
        mig_enabled=False,
    )


def result(
    device: str, memory: str, cores: str, share: str | None = "s-1", request: str = "gpu"
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request": request,
        "driver": DRIVER_NAME,
        "pool": "node-a",
        "device": device,
        "consumedCapacity": {"memory": memory, "cores": cores},
    }
    if share:
        out["shareID"] = share
    return out


def claim(
    *results: dict[str, Any], uid: str = "uid-1", name: str = "c1", allocated: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"namespace": "ns", "name": name, "uid": uid}, "status": {}}
    if allocated:
        body["status"]["allocation"] = {"devices": {"results": list(results)}}
    return body
