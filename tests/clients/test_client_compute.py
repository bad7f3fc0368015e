"""A claim's compute cap holds within 1 point for kernels launched by NVIDIA's Python clients,
CUDA 12 and CUDA 13 lines: cuda.core's ``launch`` of an NVRTC-compiled kernel and a numba-cuda
``@cuda.jit`` kernel, each from a process of a claim capped at 30 % of the GPU.

Measured as tests/shim/test_shim_compute.py measures the shim's own workload: the kernels' GPU
time (their count x the simulated node's kernel duration) over the workload's wall time, which a
busy machine can lower (a launcher waiting for a CPU launches nothing) but never raise; so the
share must be at most 1 point above the cap and at most 1 point below it plus the time the
launching thread waited for a CPU."""

from __future__ import annotations

import pytest

from testbed.shim_harness import ClaimFactory, share_of
from tests.clients.client_lines import ClientLine

# Shares of time are measured: no other test may share the CPUs (tests/conftest.py).
pytestmark = pytest.mark.alone

CAP = 30
TOLERANCE = 1.0  # percentage points
KERNEL_NS = 2_000_000
SECONDS = 3.0
DEPTH = 4


@pytest.mark.parametrize("library", ["cuda.core", "numba"])
def test_the_cap_holds_for_kernels_the_client_launches(
    make_claim: ClaimFactory, line: ClientLine, library: str
) -> None:
    """One process of a claim capped at 30 % keeps 4 kernels of 2 ms queued for 3 s through the
    client: its kernels take 30 % of the GPU's time, within 1 point."""
    claim = make_claim(limits=[(0, None, CAP)], default_kernel_ns=KERNEL_NS, **line.node)
    worker = claim.popen(line.argv("duty.py", library, str(KERNEL_NS), str(SECONDS), str(DEPTH)))
    out, err = worker.communicate(timeout=SECONDS + 120)
    assert worker.returncode == 0, err
    share = share_of(out)
    assert share.near(CAP, TOLERANCE), out
