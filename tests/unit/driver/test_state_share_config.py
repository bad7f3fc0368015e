"""Prepare carries a claim's ShareConfig onto the node: priority into its limits and its GPUs'
priority boards (writable only for high priority), enforcement off as a spec without the shim,
and a bad configuration, or priority 0 in a namespace not granted it, as a refusal that writes
nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tessera.driver.allocation import AllocationError
from tessera.driver.config import DriverConfig
from tessera.driver.state import DeviceState
from tessera.names import DRIVER_NAME
from tessera.shim import format as shim_format
from tests.unit.driver.driver_samples import claim
from tests.unit.driver.test_state import GPUS, OWN_DRIVER, A, B, node_result


@pytest.fixture
def config(tmp_path: Path) -> DriverConfig:
    return DriverConfig(
        node_name="node-a",
        cdi_dir=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        high_priority_namespaces=frozenset({"ns"}),  # driver_samples.claim's namespace
    )


def configured(body: dict[str, Any], **keys: Any) -> dict[str, Any]:
    parameters = {"apiVersion": "gpu.tessera.dev/v1", "kind": "ShareConfig", **keys}
    body["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER_NAME, "parameters": parameters},
        }
    ]
    return body


def spec_of(config: DriverConfig, uid: str) -> dict[str, Any]:
    return dict(json.loads((config.cdi_dir / f"k8s.gpu.tessera.dev-claim_{uid}.json").read_text()))


def mounts(spec: dict[str, Any]) -> dict[str, list[str]]:
    return {m["containerPath"]: m["options"] for m in spec["containerEdits"]["mounts"]}


def test_priority_reaches_the_limits_and_only_high_claims_may_write_the_board(config: DriverConfig) -> None:
    state = DeviceState(config, GPUS, OWN_DRIVER, "boot-1")
    state.prepare(configured(claim(node_result(A, "1Gi", "30", "s1"), uid="high"), priority=0))
    state.prepare(claim(node_result(A, "1Gi", "30", "s2"), node_result(B, "1Gi", "0", "s3"), uid="low"))

    high_limits = shim_format.read_limits(config.claims_dir / "high" / "limits")
    assert high_limits == [shim_format.GpuLimit(GPUS[0].uuid, 1 << 30, 30, shim_format.PRIORITY_HIGH)]
    low_limits = shim_format.read_limits(config.claims_dir / "low" / "limits") or []
    assert [g.priority for g in low_limits] == [shim_format.PRIORITY_LOW] * 2

    board = config.state_dir / "priority" / GPUS[0].uuid
    assert shim_format.read_board(board) is not None
    high_mounts, low_mounts = mounts(spec_of(config, "high")), mounts(spec_of(config, "low"))
    assert high_mounts[f"/run/tessera/priority/{GPUS[0].uuid}"][0] == "rw"
    assert low_mounts[f"/run/tessera/priority/{GPUS[0].uuid}"][0] == "ro"
    assert low_mounts[f"/run/tessera/priority/{GPUS[1].uuid}"][0] == "ro"
    assert {m["hostPath"] for m in spec_of(config, "low")["containerEdits"]["mounts"]} >= {str(board)}

    # Unpreparing a claim leaves the board: the other claims on the GPU have it mounted.
    state.unprepare("high")
    assert board.exists()


def test_enforcement_off_on_a_whole_gpu_gets_the_gpu_without_the_shim(config: DriverConfig) -> None:
    state = DeviceState(config, GPUS, OWN_DRIVER, "boot-1")
    devices = state.prepare(
        configured(claim(node_result(A, "80Gi", "100", "s1"), uid="whole"), enforcement="off")
    )
    assert [d.device for d in devices] == [A]
    spec = spec_of(config, "whole")
    env = spec["containerEdits"]["env"]
    assert f"CUDA_VISIBLE_DEVICES={GPUS[0].uuid}" in env
    assert not any(e.startswith(("TESSERA_LIMITS_FILE=", "TESSERA_USAGE_REGION=")) for e in env)
    paths = set(mounts(spec))
    assert not paths & {"/run/tessera", "/run/tessera/usage"}
    assert not any(p.startswith("/run/tessera/priority") for p in paths)
    folder = config.claims_dir / "whole"
    assert sorted(p.name for p in folder.iterdir()) == ["claim.json", "ld.so.preload"]
    # The driver's own libraries, where the container sees them: no shim in between.
    assert (folder / "ld.so.preload").read_text().split() == [
        "/run/tessera/driver/libcuda.so.1",
        "/run/tessera/driver/libnvidia-ml.so.1",
    ]
    assert mounts(spec)["/etc/ld.so.preload"][0] == "ro"


def test_a_refused_configuration_writes_nothing(config: DriverConfig) -> None:
    state = DeviceState(config, GPUS, OWN_DRIVER, "boot-1")
    ungranted = DeviceState(
        dataclasses.replace(config, high_priority_namespaces=frozenset({"other"})), GPUS, OWN_DRIVER, "boot-1"
    )
    for uid, body, daemon, reason in (
        (
            "partial",
            configured(claim(node_result(A, "40Gi", "100", "s1"), uid="partial"), enforcement="off"),
            state,
            "allowed only on a whole GPU",
        ),
        (
            "bad",
            configured(claim(node_result(A, "1Gi", "10", "s1"), uid="bad"), priority=5),
            state,
            "priority 5",
        ),
        (
            "high",
            configured(claim(node_result(A, "1Gi", "10", "s1"), uid="high"), priority=0),
            ungranted,
            'namespace "ns" is not listed',
        ),
    ):
        with pytest.raises(AllocationError, match=reason):
            daemon.prepare(body)
        assert not (config.claims_dir / uid).exists()
        assert not (config.cdi_dir / f"k8s.gpu.tessera.dev-claim_{uid}.json").exists()
        assert uid not in daemon.records()
