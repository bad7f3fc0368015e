"""NVML read in-process by NVIDIA's own NVML client (nvidia-ml-py), any number of times, leaves a
claim's accounting exact while NVIDIA's CUDA clients hold its memory - CUDA 12 and CUDA 13 lines,
through cuda-bindings, cuda.core and numba-cuda: 5 GiB held of an 8 GiB claim, NVML memory info
(v1 and v2) read several times 0.15 s apart (each reading may sweep the usage region for dead
processes), the next 8 GiB refused with CUDA_ERROR_OUT_OF_MEMORY and the 3 GiB left granted, in one
process and across two processes of the claim."""

from __future__ import annotations

import pytest

from simgpu.config import GiB
from testbed.shim_harness import Claim, ClaimFactory
from tests.clients.client_lines import ClientLine

LIMIT = 8 * GiB
HELD = 5 * GiB
OOM = "2"  # CUDA_ERROR_OUT_OF_MEMORY
# NVML sweeps at a memory-info call once the last sweep is 0.1 s old: readings this far apart
# each sweep.
READINGS = "nvml 4 150"
# One path of each client library (test_client_memory.py runs every path).
APIS = ["cuMemAlloc", "cuda.core.device", "numba.device_array"]


def big_claim(make_claim: ClaimFactory, line: ClientLine) -> Claim:
    """An 8 GiB claim on a 16 GiB GPU: the driver itself never refuses what the tests take."""
    return make_claim(limits=[(0, LIMIT, 0)], memory_bytes=16 * GiB, **line.node)


@pytest.mark.parametrize("api", APIS)
def test_nvml_readings_in_the_holding_process_leave_its_memory_counted(
    make_claim: ClaimFactory, line: ClientLine, api: str
) -> None:
    """A process holding 5 GiB of an 8 GiB claim reads NVML memory info (v1 and v2) four times,
    0.15 s apart, and sees 5 GiB used each time; it is then refused the whole 8 GiB and granted
    the 3 GiB left."""
    holder = line.process(big_claim(make_claim, line), api).holding(HELD)
    try:
        assert holder.nvml_used(READINGS) == [HELD] * 8
        assert holder.ask(f"alloc {LIMIT}")["rc"] == OOM
        assert holder.ask(f"alloc {LIMIT - HELD}")["rc"] == "0"
        assert holder.nvml_used("nvml 1 0") == [LIMIT] * 2
    finally:
        holder.kill()


@pytest.mark.parametrize("api", APIS)
def test_nvml_readings_in_one_process_leave_its_memory_counted_for_another(
    make_claim: ClaimFactory, line: ClientLine, api: str
) -> None:
    """While one process of the claim holds 5 GiB and reads NVML memory info four times 0.15 s
    apart, another process of the claim (the same client) reads it too, is refused the whole
    8 GiB and is granted the 3 GiB left."""
    claim = big_claim(make_claim, line)
    holder = line.process(claim, api).holding(HELD)
    other = line.process(claim, api)
    try:
        assert holder.nvml_used(READINGS) == [HELD] * 8
        assert other.ask("cuda")["rc"] == "0"
        assert other.nvml_used(READINGS) == [HELD] * 8
        assert other.ask(f"alloc {LIMIT}")["rc"] == OOM
        assert other.ask(f"alloc {LIMIT - HELD}")["rc"] == "0"
        assert holder.nvml_used("nvml 1 0") == [LIMIT] * 2
    finally:
        holder.kill()
        other.kill()
