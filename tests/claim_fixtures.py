"""Fixtures for the tiers that run processes under the shim (tests/shim, tests/clients): the shim
built as the package build builds it, the simulated driver, and claims (limits file + usage region
+ shim installation) on simulated nodes. Each tier's conftest imports them from here.

The shim is built when this file is imported (by a tier's conftest), before the test modules that
import its cffi binding are collected. With $TESSERA_SHIM_DRIVER_DIR naming the directory of NVIDIA's
libcuda.so.1 and libnvidia-ml.so.1 (tests/gpu/run_shim_gpu_checks.sh sets it), the same tests
run against the real driver and GPUs; the few that assert simulator specifics skip there.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from testbed.shim_harness import (
    PROGRAM_BUILD,
    SIMGPU_BUILD,
    Claim,
    ClaimFactory,
    build_programs,
    build_shim,
    build_simgpu,
)

build_shim()

from simgpu.config import GiB, NodeSpec, make_gpus, process_env, write_config  # noqa: E402
from tessera.shim.format import GpuLimit, create_region, write_limits  # noqa: E402
from tessera.shim.install import install  # noqa: E402

REAL_DRIVER = (
    Path(os.environ["TESSERA_SHIM_DRIVER_DIR"]) if os.environ.get("TESSERA_SHIM_DRIVER_DIR") else None
)


@pytest.fixture(scope="session", autouse=True)
def built() -> Path:
    """The simulated driver and the shim's test programs."""
    build_simgpu()
    return build_programs(PROGRAM_BUILD, REAL_DRIVER or SIMGPU_BUILD)


@pytest.fixture
def simulated_only() -> None:
    """Skip on a real GPU: the test asserts what only the simulator guarantees (sizes, counts)."""
    if REAL_DRIVER is not None:
        pytest.skip("asserts simulated-GPU specifics")


@pytest.fixture
def simulated() -> bool:
    """Whether the driver is the simulator (its own usage is then exact to compare with)."""
    return REAL_DRIVER is None


def _real_uuids() -> list[str]:
    done = subprocess.run(
        [str(PROGRAM_BUILD / "shim_probe"), "devices"], capture_output=True, text=True, check=True
    )
    return [line.split("uuid=")[1].split()[0] for line in done.stdout.splitlines() if "uuid=" in line]


@pytest.fixture
def make_claim(tmp_path: Path) -> ClaimFactory:
    """Factory: ``make_claim(limits=[(gpu_index, memory_bytes|None, cores)], gpus=1,
    memory_bytes=1 GiB, region=True, name="claim")`` - a simulated node with ``gpus`` GPUs and a
    claim on it. Claims made with the same ``node`` name share the node."""
    nodes: dict[str, tuple[NodeSpec, Path]] = {}

    def factory(
        limits: Sequence[tuple[int, int | None, int]] = ((0, 256 << 20, 0),),
        gpus: int = 1,
        memory_bytes: int = GiB,
        region: bool = True,
        name: str = "claim",
        node: str = "node",
        log_level: str = "warn",
        **node_fields: object,
    ) -> Claim:
        if REAL_DRIVER is not None:
            real = _real_uuids()
            if gpus > len(real):
                pytest.skip(f"needs {gpus} GPUs, this machine has {len(real)}")
            base = tmp_path / name
            installation = install(
                base / "shim", REAL_DRIVER / "libcuda.so.1", REAL_DRIVER / "libnvidia-ml.so.1"
            )
            limits_file = write_limits(
                base / "limits", [GpuLimit(real[i], mem, cores) for i, mem, cores in limits]
            )
            region_file = create_region(base / "usage") if region else None
            return Claim(
                installation.directory, limits_file, region_file, dict(os.environ), PROGRAM_BUILD, log_level
            )
        if node not in nodes:
            spec = NodeSpec(
                state_file=tmp_path / node / "state", gpus=make_gpus(gpus, node, memory_bytes=memory_bytes)
            )
            for key, value in node_fields.items():
                object.__setattr__(spec, key, value)
            nodes[node] = (spec, write_config(spec, tmp_path / node / "simgpu.conf"))
        spec, config = nodes[node]
        base = tmp_path / name
        installation = install(
            base / "shim", SIMGPU_BUILD / "libcuda.so.1", SIMGPU_BUILD / "libnvidia-ml.so.1"
        )
        limits_file = write_limits(
            base / "limits", [GpuLimit(spec.gpus[i].uuid, mem, cores) for i, mem, cores in limits]
        )
        region_file = create_region(base / "usage") if region else None
        return Claim(
            installation.directory, limits_file, region_file, process_env(config), PROGRAM_BUILD, log_level
        )

    return factory
