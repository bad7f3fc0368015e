"""Static MIG on the node: a GPU in MIG mode is published as its instances (exclusive devices with
profile, parent and memory), never as a share; a mode switch seen by the health poll republishes;
a claim of instances is prepared with exactly those instances and no shim."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from tessera.driver import devices
from tessera.driver.allocation import AllocationError, shares
from tessera.driver.config import DriverConfig
from tessera.driver.container_driver import ContainerDriver, DriverSourceError
from tessera.driver.device_health import HealthTracker
from tessera.driver.discovery import MIG_PROFILE, MigDevice
from tessera.driver.state import DeviceState
from tessera.names import DRIVER_NAME
from tessera.proto.health.v1 import api_pb2 as v1
from tessera.quantity import GiB
from tessera.slices import published_gpus
from tests.unit.driver.driver_samples import claim, gpu, result

SMALL = MigDevice("MIG-11111111-2222-3333-4444-555555555555", "1g.10gb", 10 * GiB, 1, 0)
LARGE = MigDevice("MIG-66666666-7777-8888-9999-000000000000", "3g.40gb", 40 * GiB, 2, 0)
MIG_GPU = replace(gpu(0), mig_enabled=True, mig_devices=(SMALL, LARGE))
WHOLE = gpu(1)
SMALL_NAME = devices.mig_device_name(SMALL)
OWN_DRIVER = ContainerDriver(
    None,
    {PurePosixPath("/run/tessera/driver/libcuda.so.1"): Path("/host/libcuda.so.1")},
    PurePosixPath("/run/tessera/driver/libcuda.so.1"),
    PurePosixPath("/run/tessera/driver/libnvidia-ml.so.1"),
    (),
    Path("/nonexistent-dev"),
    loader_libraries={PurePosixPath("/usr/lib/x86_64-linux-gnu/libcuda.so.1"): Path("/host/libcuda.so.1")},
)


def mig_result(device: str = SMALL_NAME) -> dict[str, object]:
    """An exclusive device's allocation result: no shareID, no consumed capacity."""
    return {"request": "mig", "driver": DRIVER_NAME, "pool": "node-a", "device": device}


def test_a_gpu_in_mig_mode_is_published_as_its_instances_and_the_other_as_a_share() -> None:
    published = devices.node_devices([MIG_GPU, WHOLE], {MIG_GPU.uuid: [devices.DeviceTaint("k", "lost")]})
    assert [d["name"] for d in published] == [
        "mig-11111111-2222-3333-4444-555555555555",
        "mig-66666666-7777-8888-9999-000000000000",
        devices.device_name(WHOLE),
    ]
    small = published[0]
    assert "allowMultipleAllocations" not in small
    assert small["capacity"] == {"memory": {"value": str(10 * GiB)}}
    attributes = small["attributes"]
    assert attributes["type"] == {"string": "mig"}
    assert attributes["profile"] == {"string": "1g.10gb"}
    assert attributes["uuid"] == {"string": SMALL.uuid}
    assert attributes["parentUUID"] == {"string": MIG_GPU.uuid}
    assert attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attributes["index"] == {"int": 0}
    assert [t["key"] for t in small["taints"]] == ["k"], "an instance carries its GPU's taints"
    assert published[2]["attributes"]["type"] == {"string": "gpu"}
    assert published[2]["allowMultipleAllocations"] is True


def test_mig_device_names_are_dns_labels_for_both_uuid_forms() -> None:
    old_form = replace(SMALL, uuid="MIG-GPU-00000000-1111-2222-3333-444455556666/7/0")
    assert devices.mig_device_name(old_form) == "mig-gpu-00000000-1111-2222-3333-444455556666-7-0"
    assert len(devices.mig_device_name(old_form)) <= 63


@pytest.mark.parametrize("profile", ["1g.10gb", "1g.10gb+me", "7g.80gb", "1c.3g.40gb", "1g.5gb+me+gfx"])
def test_nvidia_profiles_are_recognised(profile: str) -> None:
    assert MIG_PROFILE.fullmatch(profile)


@pytest.mark.parametrize("profile", ["", "big", "0g.10gb", "1g.10", "1g.10gb; rm", "1G.10GB"])
def test_other_names_are_not_profiles(profile: str) -> None:
    assert not MIG_PROFILE.fullmatch(profile)


def test_the_shared_reader_counts_only_gpus_as_shareable() -> None:
    """The webhook's fleet and the admission check never count a MIG instance as a GPU to share;
    a device without a type (a slice from before MIG support) still is one."""
    published = devices.node_devices([MIG_GPU, WHOLE], {})
    untyped = devices.device(gpu(2))
    del untyped["attributes"]["type"]
    odd = devices.device(gpu(3))
    odd["attributes"]["type"] = {"int": 1}
    slice_ = {"spec": {"driver": DRIVER_NAME, "pool": {"name": "n"}, "devices": [*published, untyped, odd]}}
    assert [g.uuid for g in published_gpus([slice_])] == [WHOLE.uuid, gpu(2).uuid]


def test_an_instance_is_allocated_whole_and_one_that_is_gone_is_named() -> None:
    body = claim(mig_result())
    (share,) = shares(body, DRIVER_NAME, "node-a", [SMALL_NAME], exclusive=[SMALL_NAME])
    assert (share.device, share.memory_bytes, share.cores, share.share_id) == (SMALL_NAME, 0, 0, None)
    with pytest.raises(AllocationError, match=f"allocated MIG instance {SMALL_NAME}, which is gone"):
        shares(body, DRIVER_NAME, "node-a", [devices.device_name(WHOLE)])


class FakeLayouts:
    """layout_of for the tracker: what NVML says now about each GPU's MIG mode."""

    def __init__(self) -> None:
        self.now: dict[str, tuple[bool, tuple[MigDevice, ...]] | None] = {
            MIG_GPU.uuid: (True, (SMALL, LARGE)),
            WHOLE.uuid: (False, ()),
        }

    def __call__(self, uuid: str) -> tuple[bool, tuple[MigDevice, ...]] | None:
        return self.now[uuid]


def test_a_mode_switch_seen_by_the_poll_changes_the_gpus_and_announces_it() -> None:
    tracker = HealthTracker([MIG_GPU, WHOLE], "node-a", check_timeout=30)
    layouts = FakeLayouts()
    announced: list[list[str]] = []
    tracker.on_change = lambda: announced.append(
        [n for g in tracker.gpus() for n in devices.published_names(g)]
    )
    tracker.poll(lambda uuid: None, layouts)
    assert announced == []
    layouts.now[WHOLE.uuid] = (True, (replace(SMALL, uuid="MIG-aaaaaaaa-2222-3333-4444-555555555555"),))
    layouts.now[MIG_GPU.uuid] = (False, ())
    tracker.poll(lambda uuid: None, layouts)
    assert announced == [[devices.device_name(MIG_GPU), "mig-aaaaaaaa-2222-3333-4444-555555555555"]]
    report = tracker.report(v1)
    assert [d.device.device_name for d in report.devices] == announced[0]
    layouts.now[WHOLE.uuid] = None  # NVML cannot say: nothing changes
    tracker.poll(lambda uuid: None, layouts)
    assert len(announced) == 1


def test_a_lost_gpus_layout_is_not_asked(caplog: pytest.LogCaptureFixture) -> None:
    tracker = HealthTracker([MIG_GPU], "node-a", check_timeout=30)

    def layout_of(uuid: str) -> tuple[bool, tuple[MigDevice, ...]] | None:
        raise AssertionError("asked the layout of a lost GPU")

    tracker.poll(lambda uuid: "GPU is lost", layout_of)
    assert tracker.gpus() == [MIG_GPU]


@pytest.fixture
def config(tmp_path: Path) -> DriverConfig:
    return DriverConfig(
        node_name="node-a",
        cdi_dir=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        container_env=(("SIMGPU_CONFIG", "/sim/conf"),),
    )


def test_prepare_of_an_instance_names_it_and_adds_no_shim(config: DriverConfig) -> None:
    state = DeviceState(config, [MIG_GPU, WHOLE], OWN_DRIVER, "boot")
    (prepared,) = state.prepare(claim(mig_result()))
    assert prepared.device == SMALL_NAME and prepared.share_id is None
    assert prepared.cdi_device_ids == (f"k8s.gpu.tessera.dev/claim=uid-1-{SMALL_NAME}",)
    spec = json.loads((config.cdi_dir / "k8s.gpu.tessera.dev-claim_uid-1.json").read_text())
    edits = spec["containerEdits"]
    assert edits["env"] == [
        f"CUDA_VISIBLE_DEVICES={SMALL.uuid}",
        f"NVIDIA_VISIBLE_DEVICES={SMALL.uuid}",
        "SIMGPU_CONFIG=/sim/conf",
    ]
    assert [m["containerPath"] for m in edits["mounts"]] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert spec["devices"][0]["name"] == f"uid-1-{SMALL_NAME}"
    folder = config.claims_dir / "uid-1"
    assert sorted(p.name for p in folder.iterdir()) == ["claim.json"], "no limits, region, shim or preload"
    assert state.prepare(claim(mig_result())) == [prepared]
    assert state.unprepare("uid-1") and not folder.exists()


def test_with_the_toolkit_an_instance_is_its_cdi_device_by_uuid(config: DriverConfig) -> None:
    toolkit = replace(OWN_DRIVER, toolkit_kind="nvidia.com/gpu", libraries={}, loader_libraries={})
    state = DeviceState(config, [MIG_GPU], toolkit, "boot")
    (prepared,) = state.prepare(claim(mig_result()))
    assert prepared.cdi_device_ids[1:] == (f"nvidia.com/gpu={SMALL.uuid}",)


def test_a_claim_mixing_instances_and_shares_is_refused(config: DriverConfig) -> None:
    state = DeviceState(config, [MIG_GPU, WHOLE], OWN_DRIVER, "boot")
    body = claim(mig_result(), result(devices.device_name(WHOLE), "1Gi", "10"))
    with pytest.raises(AllocationError, match="holds both MIG instances and GPU shares"):
        state.prepare(body)


def test_an_instance_gone_since_allocation_fails_prepare_with_a_sentence(config: DriverConfig) -> None:
    state = DeviceState(config, [MIG_GPU, WHOLE], OWN_DRIVER, "boot")
    state.set_gpus([replace(MIG_GPU, mig_enabled=False, mig_devices=()), WHOLE])
    with pytest.raises(AllocationError, match="which is gone from this node"):
        state.prepare(claim(mig_result()))


def test_own_mode_with_the_kernel_driver_grants_the_instance_caps(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").touch()
    minors = tmp_path / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngarbage\n")
    driver = replace(OWN_DRIVER, common_device_nodes=(dev / "nvidiactl",), device_dir=dev, mig_minors=minors)
    assert driver.mig_device_nodes(0, 1, 0) == (
        dev / "nvidia0",
        dev / "nvidia-caps" / "nvidia-cap12",
        dev / "nvidia-caps" / "nvidia-cap13",
    )
    with pytest.raises(DriverSourceError, match="does not list gpu0/gi2/access, gpu0/gi2/ci0/access"):
        driver.mig_device_nodes(0, 2, 0)
    with pytest.raises(DriverSourceError, match="cannot read"):
        replace(driver, mig_minors=tmp_path / "absent").mig_device_nodes(0, 1, 0)
    assert OWN_DRIVER.mig_device_nodes(0, 1, 0) == (), "the simulated driver has no device nodes"
