"""Prepare and unprepare write exactly one claim's files, are idempotent, and converge after crashes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tessera.driver import checkpoint
from tessera.driver.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, ClaimRecord, PreparedDevice
from tessera.driver.config import DriverConfig
from tessera.driver.container_driver import ContainerDriver
from tessera.driver.devices import device_name
from tessera.driver.state import DeviceState
from tessera.quantity import GiB
from tessera.shim import format as shim_format
from tests.unit.driver.driver_samples import claim, gpu, result

GPUS = [gpu(0), gpu(1)]
A, B = device_name(GPUS[0]), device_name(GPUS[1])
OWN_DRIVER = ContainerDriver(
    None,
    {PurePosixPath("/run/tessera/driver/libcuda.so.1"): Path("/host/libcuda.so.1")},
    PurePosixPath("/run/tessera/driver/libcuda.so.1"),
    PurePosixPath("/run/tessera/driver/libnvidia-ml.so.1"),
    (),
    Path("/nonexistent-dev"),
)


def node_result(device: str, memory: str, cores: str, share: str) -> dict[str, Any]:
    return {**result(device, memory, cores, share=share), "pool": "node-a"}


@pytest.fixture
def config(tmp_path: Path) -> DriverConfig:
    return DriverConfig(node_name="node-a", cdi_dir=tmp_path / "cdi", state_dir=tmp_path / "state")


def state(config: DriverConfig, boot: str = "boot-1") -> DeviceState:
    return DeviceState(config, GPUS, OWN_DRIVER, boot)


def test_prepare_writes_the_limits_region_shim_preload_and_spec_of_the_claim(config: DriverConfig) -> None:
    body = claim(
        node_result(A, "20Gi", "30", "s1"),
        node_result(A, "10Gi", "10", "s2"),
        node_result(B, "1Gi", "0", "s3"),
    )
    devices = state(config).prepare(body)

    assert [(d.device, d.share_id) for d in devices] == [(A, "s1"), (A, "s2"), (B, "s3")]
    assert devices[0].cdi_device_ids == (f"k8s.gpu.tessera.dev/claim=uid-1-{A}-s1",)
    folder = config.claims_dir / "uid-1"
    limits = shim_format.read_limits(folder / "limits")
    assert limits == [
        shim_format.GpuLimit(GPUS[0].uuid, 30 * GiB, 40),
        shim_format.GpuLimit(GPUS[1].uuid, 1 * GiB, 0),
    ]
    assert (folder / "limits").stat().st_mode & 0o777 == 0o444
    assert shim_format.read_region(folder / "usage").processes == []
    assert os.readlink(folder / "shim" / "libcuda-real.so.1") == "/run/tessera/driver/libcuda.so.1"
    assert os.readlink(folder / "shim" / "libnvidia-ml-real.so.1") == "/run/tessera/driver/libnvidia-ml.so.1"
    assert (folder / "ld.so.preload").read_text().split() == [
        "/run/tessera/shim/libtessera-cuda.so",
        "/run/tessera/shim/libtessera-nvml.so",
    ]
    spec = json.loads((config.cdi_dir / "k8s.gpu.tessera.dev-claim_uid-1.json").read_text())
    assert len(spec["devices"]) == 3
    assert f"CUDA_VISIBLE_DEVICES={GPUS[0].uuid},{GPUS[1].uuid}" in spec["containerEdits"]["env"]
    # The folder is mounted read-only, so every mount the spec makes inside it has its empty file.
    inside = [
        m["containerPath"].removeprefix("/run/tessera/")
        for m in spec["containerEdits"]["mounts"]
        if m["containerPath"].startswith("/run/tessera/")
    ]
    assert "driver/libcuda.so.1" in inside and f"priority/{GPUS[0].uuid}" in inside
    assert [p for p in inside if not (folder / p).is_file()] == []


def test_preparing_again_returns_the_same_devices_and_keeps_the_usage_region(config: DriverConfig) -> None:
    body = claim(node_result(A, "20Gi", "30", "s1"))
    devices = state(config)
    first = devices.prepare(body)
    region = config.claims_dir / "uid-1" / "usage"
    before = region.stat().st_ino
    assert devices.prepare(body) == first
    assert state(config).prepare(body) == first, "a restarted daemon too"
    assert region.stat().st_ino == before
    assert devices.records()["uid-1"].state == PREPARE_COMPLETED


def test_a_prepare_cut_short_after_its_checkpoint_is_completed_by_the_retry(config: DriverConfig) -> None:
    body = claim(node_result(A, "20Gi", "30", "s1"))
    checkpoint.save(
        config.checkpoint_file,
        checkpoint.Checkpoint("boot-1", {"uid-1": ClaimRecord("uid-1", "ns", "c1", PREPARE_STARTED, ())}),
    )
    restarted = state(config)
    devices = restarted.prepare(body)
    assert restarted.records()["uid-1"].state == PREPARE_COMPLETED
    assert restarted.records()["uid-1"].devices == tuple(devices)
    assert (config.claims_dir / "uid-1" / "limits").exists()


def test_unprepare_removes_everything_and_an_unknown_claim_succeeds(config: DriverConfig) -> None:
    devices = state(config)
    devices.prepare(claim(node_result(A, "20Gi", "30", "s1")))
    assert devices.unprepare("uid-1") is True
    assert not (config.claims_dir / "uid-1").exists()
    assert list(config.cdi_dir.iterdir()) == []
    assert devices.records() == {}
    assert devices.unprepare("uid-1") is False
    assert devices.unprepare("never-seen") is False
    assert state(config).records() == {}, "the removal is checkpointed"


def test_concurrent_prepares_of_many_claims_and_of_one_claim_all_land_once(config: DriverConfig) -> None:
    devices = state(config)
    bodies = [claim(node_result(A, "1Gi", "1", f"s{i}"), uid=f"u{i}", name=f"c{i}") for i in range(16)]
    same = claim(node_result(B, "2Gi", "2", "t"), uid="same", name="same")
    results: dict[str, list[PreparedDevice]] = {}
    errors: list[BaseException] = []

    def run(key: str, body: dict[str, Any]) -> None:
        try:
            results[key] = devices.prepare(body)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(f"u{i}", b)) for i, b in enumerate(bodies)]
    threads += [threading.Thread(target=run, args=(f"same{i}", same)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({tuple(results[f"same{i}"]) for i in range(8)}) == 1
    records = state(config).records()
    assert sorted(records) == sorted([*(f"u{i}" for i in range(16)), "same"])
    assert all(r.state == PREPARE_COMPLETED for r in records.values())
    assert sorted(p.name for p in config.claims_dir.iterdir()) == sorted(records)
    assert devices.locks_held() == 0, "no per-claim lock outlives its calls"


def test_after_a_reboot_the_old_records_are_not_trusted(config: DriverConfig) -> None:
    state(config).prepare(claim(node_result(A, "20Gi", "30", "s1")))
    rebooted = state(config, boot="boot-2")
    assert rebooted.records() == {}
    assert rebooted.rebuild_reason is not None and "rebooted" in rebooted.rebuild_reason
    assert rebooted.devices_on_host() == {"uid-1"}, "left for the rebuild to re-prepare or remove"
