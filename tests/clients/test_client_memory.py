"""Every allocation path of NVIDIA's Python CUDA clients, CUDA 12 and CUDA 13 lines, stops exactly
at a claim's memory limit: the allocation that brings the claim's usage to the limit succeeds, one
byte more is refused with CUDA_ERROR_OUT_OF_MEMORY (one granule more where the API takes whole
granules only), and the driver API and NVML report the limit as the device's total memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from simgpu.config import GiB
from testbed.shim_harness import ClaimFactory
from tests.clients.client_lines import ClientLine

MiB = 1 << 20

LIMIT = 256 * MiB
# The last piece allocated: a whole VMM granule and a whole pool growth granule (2 MiB, the
# simulator's and the shim's), so that each path can bring the usage exactly to the limit.
LAST = 2 * MiB
OOM = "2"  # CUDA_ERROR_OUT_OF_MEMORY
# cuda-bindings resolves the per-thread default stream flavour of each entry point with this set.
PTSZ = {"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}


@dataclass(frozen=True)
class AllocationPath:
    """One allocation path of programs/client.py."""

    api: str
    over: int = LAST + 1
    """One more than the last piece: a byte, or a granule where the API takes whole granules only."""
    env: Mapping[str, str] = field(default_factory=dict)
    entry: str | None = None
    """The libcuda.so.1 entry point cuda-bindings must call for ``api``: given for the stream-ordered
    paths, whose entry points have a per-thread (_ptsz) flavour beside the plain one."""


PATHS = {
    "cuMemAlloc": AllocationPath("cuMemAlloc"),
    "cuMemAllocPitch": AllocationPath("cuMemAllocPitch"),
    "cuMemAllocManaged": AllocationPath("cuMemAllocManaged"),
    "cuMemAllocAsync": AllocationPath("cuMemAllocAsync", entry="cuMemAllocAsync"),
    "cuMemAllocFromPoolAsync": AllocationPath("cuMemAllocFromPoolAsync", entry="cuMemAllocFromPoolAsync"),
    "cuMemAllocAsync_ptsz": AllocationPath("cuMemAllocAsync", env=PTSZ, entry="cuMemAllocAsync_ptsz"),
    "cuMemAllocFromPoolAsync_ptsz": AllocationPath(
        "cuMemAllocFromPoolAsync", env=PTSZ, entry="cuMemAllocFromPoolAsync_ptsz"
    ),
    "cuMemCreate": AllocationPath("cuMemCreate", over=2 * LAST),
    "cuda.core.device": AllocationPath("cuda.core.device"),
    "cuda.core.pool": AllocationPath("cuda.core.pool"),
    "cuda.core.virtual": AllocationPath("cuda.core.virtual"),
    "numba.device_array": AllocationPath("numba.device_array"),
}


@pytest.mark.parametrize("path", PATHS)
def test_each_allocation_path_stops_exactly_at_the_limit(
    make_claim: ClaimFactory, line: ClientLine, path: str
) -> None:
    """A process of a 256 MiB claim on a 16 GiB GPU allocates all but 2 MiB through one path, is
    refused 2 MiB and a byte (or a granule) with CUDA_ERROR_OUT_OF_MEMORY, gets the last 2 MiB,
    and then sees, through cuMemGetInfo, cuDeviceTotalMem and NVML v1 and v2, a device of 256 MiB
    with nothing free."""
    chosen = PATHS[path]
    claim = make_claim(limits=[(0, LIMIT, 0)], memory_bytes=16 * GiB, **line.node)
    process = line.process(claim, chosen.api, chosen.env)
    try:
        assert process.ask("cuda")["rc"] == "0"
        if chosen.entry is not None:
            assert process.ask(f"entry {chosen.api}")["entry"] == chosen.entry
        assert process.ask(f"alloc {LIMIT - LAST}")["rc"] == "0"
        assert process.ask(f"alloc {chosen.over}")["rc"] == OOM
        assert process.ask(f"alloc {LAST}")["rc"] == "0"
        info = process.ask("info")
        assert {key: int(value) for key, value in info.items()} == {
            "total": LIMIT,
            "free": 0,
            "devtotal": LIMIT,
            "nvml_total": LIMIT,
            "nvml_used": LIMIT,
            "nvml_total_v2": LIMIT,
            "nvml_used_v2": LIMIT,
        }
    finally:
        process.kill()
