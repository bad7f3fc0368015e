"""The Python helper writes configurations the libraries accept and gives processes the right
environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from simgpu.config import (
    CONFIG_ENV,
    LIB_DIR_ENV,
    GiB,
    GpuFaults,
    GpuSpec,
    MigInstance,
    NodeSpec,
    gpu_uuid,
    library_dir,
    make_gpus,
    process_env,
    write_config,
)


def test_make_gpus_gives_distinct_stable_identities() -> None:
    """GPUs of one node differ in UUID, PCI bus id and minor number; the same node name always
    yields the same UUIDs, different nodes different ones."""
    gpus = make_gpus(3, "n")
    assert len({g.uuid for g in gpus}) == len({g.pci_bus_id for g in gpus}) == 3
    assert [g.minor for g in gpus] == [0, 1, 2]
    assert make_gpus(3, "n") == gpus
    assert gpu_uuid("m", 0) != gpus[0].uuid


def test_write_config_is_atomic_and_renders_every_field(tmp_path: Path) -> None:
    """write_config writes every field of the spec in the format docs/simgpu.md gives (the
    expected text is written out here, not produced by the code under test, and every value
    differs from its default, so a field dropped or written from the wrong attribute shows), and
    replaces an existing file in one step: a reader that opened the old file still reads all of
    it, the path names a new file with the new text, and no temporary file is left behind."""
    gpu = GpuSpec(
        uuid="GPU-0123abcd-4567-89ab-cdef-0123456789ab",
        pci_bus_id="00000000:3B:00.0",
        minor=7,
        name="NVIDIA A100-SXM4-40GB",
        memory_bytes=40 * GiB,
        sm_count=108,
        compute_capability=(8, 0),
        brand="tesla",
        pci_device_id=0x20B010DE,
        power_watts=91,
        power_limit_watts=400,
        temperature_c=41,
        faults=GpuFaults(fail_alloc=3, lost=True),
        mig_mode=True,
        mig=(MigInstance("2g.10gb", "MIG-0123abcd-4567-89ab-cdef-0123456789ab", 10 * GiB),),
    )
    spec = NodeSpec(
        state_file=Path("/run/simgpu/w.state"),
        gpus=(gpu,),
        driver_version="535.104.05",
        cuda_driver_version=12020,
        util_window_ms=500,
        default_kernel_ns=250_000,
        latency_us=15,
        kernels={"simgpu_sleep_ns": "param0", "gemm": 1_500_000},
    )
    expected = """# Simulated NVIDIA node (Tessera simgpu); format: docs/simgpu.md
[node]
state_file = /run/simgpu/w.state
driver_version = 535.104.05
cuda_driver_version = 12020
util_window_ms = 500
default_kernel_ns = 250000
latency_us = 15

[gpu]
uuid = GPU-0123abcd-4567-89ab-cdef-0123456789ab
name = NVIDIA A100-SXM4-40GB
memory_bytes = 42949672960
sm_count = 108
compute_capability = 8.0
pci_bus_id = 00000000:3B:00.0
pci_device_id = 0x20b010de
minor = 7
brand = tesla
power_watts = 91
power_limit_watts = 400
temperature_c = 41
fail_alloc = 3
lost = true
nvml_hang = false
mig_mode = true

[mig]
profile = 2g.10gb
uuid = MIG-0123abcd-4567-89ab-cdef-0123456789ab
memory_bytes = 10737418240

[kernels]
simgpu_sleep_ns = param0
gemm = 1500000
"""
    path = tmp_path / "cfg" / "node.conf"
    write_config(NodeSpec(state_file=tmp_path / "state", gpus=make_gpus(1, "w")), path)
    before = path.read_text()
    with path.open() as reader:
        assert write_config(spec, path) == path
        assert reader.read() == before  # the old file, whole, for whoever had it open
    assert path.read_text() == expected
    assert [p.name for p in path.parent.iterdir()] == ["node.conf"]


def test_invalid_specs_are_rejected(tmp_path: Path) -> None:
    """Unknown brands and relative state files fail when the spec is made, not later in C."""
    with pytest.raises(ValueError, match="brand"):
        GpuSpec(uuid=gpu_uuid("x", 0), pci_bus_id="00000000:01:00.0", minor=0, brand="acme")
    with pytest.raises(ValueError, match="absolute"):
        NodeSpec(state_file=Path("state"), gpus=())


def test_process_env_puts_simulated_libraries_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment names the config and puts the library directory ahead of any existing
    LD_LIBRARY_PATH; $TESSERA_SIMGPU_LIB_DIR overrides where the libraries are."""
    monkeypatch.setenv(LIB_DIR_ENV, "/opt/simgpu")
    env = process_env(Path("/c.conf"), {"LD_LIBRARY_PATH": "/usr/lib/x", "HOME": "/root"})
    assert env == {
        "LD_LIBRARY_PATH": "/opt/simgpu:/usr/lib/x",
        "HOME": "/root",
        CONFIG_ENV: "/c.conf",
    }
    monkeypatch.delenv(LIB_DIR_ENV)
    assert (library_dir() / "libcuda.so.1").exists()
