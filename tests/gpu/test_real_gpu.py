"""The GPU tier: on a machine with NVIDIA's driver, tests/gpu/run_shim_gpu_checks.sh runs the
shim's suite and the overhead benchmark against the real libcuda/NVML and GPUs (results under
tests/gpu/results/, to be committed). Elsewhere the tier is skipped with the reason. It never
runs against the simulated driver (the script's dry run does that by hand)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "run_shim_gpu_checks.sh"


def _real_driver_dir() -> tuple[Path | None, str]:
    """The directory of NVIDIA's libcuda.so.1 as the loader finds it, or None and why not."""
    if not Path("/dev/nvidiactl").exists():
        return None, "no NVIDIA GPU: /dev/nvidiactl does not exist"
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False).stdout
    for line in listed.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return Path(line.split("=>")[1].strip()).parent, ""
    return None, "no NVIDIA driver: ldconfig does not find libcuda.so.1"


@pytest.mark.gpu
@pytest.mark.timeout(2700)  # the script allows 30 min for the suite and 10 for the benchmark
def test_shim_checks_pass_on_the_real_gpu() -> None:
    """The shim's whole suite and the overhead benchmark pass against the real driver."""
    driver_dir, reason = _real_driver_dir()
    if driver_dir is None:
        pytest.skip(reason)
    done = subprocess.run(
        ["bash", str(SCRIPT), str(driver_dir)], cwd=REPO, capture_output=True, text=True, timeout=2700
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
