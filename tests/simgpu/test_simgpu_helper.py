"""The Python helper writes configurations the libraries accept and gives processes the right
environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.simgpu.config import (
    CONFIG_ENV,
    LIB_DIR_ENV,
    GpuSpec,
    NodeSpec,
    gpu_uuid,
    library_dir,
    make_gpus,
    process_env,
    render,
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
    """write_config replaces the file in one step (no temporary files left behind) with the
    rendered text, which names every GPU field."""
    spec = NodeSpec(state_file=tmp_path / "state", gpus=make_gpus(1, "w"))
    path = write_config(spec, tmp_path / "cfg" / "node.conf")
    assert path.read_text() == render(spec)
    assert [p.name for p in path.parent.iterdir()] == ["node.conf"]
    for key in ("uuid", "memory_bytes", "sm_count", "compute_capability", "pci_bus_id", "minor"):
        assert f"\n{key} = " in path.read_text()


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
