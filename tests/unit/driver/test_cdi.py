"""A claim's CDI spec gives every container of the claim the shim, its limits and its GPUs."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from tessera.driver import cdi
from tessera.driver.claim_files import ClaimFiles


def make_spec(tmp_path: Path) -> dict[str, Any]:
    files = ClaimFiles(tmp_path / "claims" / "u1")
    devices = [
        cdi.CdiDevice(cdi.device_name("u1", "gpu-a", "s1"), "GPU-A"),
        cdi.CdiDevice(cdi.device_name("u1", "gpu-a", "s2"), "GPU-A", (Path("/dev/nvidia0"),)),
    ]
    return cdi.spec(
        devices,
        files,
        ["GPU-A"],
        {PurePosixPath("/usr/local/tessera/driver/libcuda.so.1"): Path("/host/libcuda.so.1")},
        [Path("/dev/nvidiactl")],
        [("SIMGPU_CONFIG", "/sim.conf")],
        [Path("/sim")],
    )


def test_two_shares_of_one_gpu_are_two_distinct_cdi_devices(tmp_path: Path) -> None:
    names = [d["name"] for d in make_spec(tmp_path)["devices"]]
    assert names == ["u1-gpu-a-s1", "u1-gpu-a-s2"]
    assert cdi.CdiDevice(names[0], "GPU-A").qualified_name == "k8s.gpu.tessera.dev/claim=u1-gpu-a-s1"


def test_the_limits_file_is_read_only_and_the_usage_region_writable_in_the_container(tmp_path: Path) -> None:
    mounts = {m["containerPath"]: m for m in make_spec(tmp_path)["containerEdits"]["mounts"]}
    assert mounts["/run/tessera/limits"]["hostPath"] == str(tmp_path / "claims/u1/limits")
    assert "ro" in mounts["/run/tessera/limits"]["options"]
    assert "rw" in mounts["/run/tessera/usage"]["options"]
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert "ro" in mounts["/usr/local/tessera/shim"]["options"]
    assert mounts["/usr/local/tessera/driver/libcuda.so.1"]["hostPath"] == "/host/libcuda.so.1"
    assert "rw" in mounts["/sim"]["options"]


def test_the_environment_names_the_limits_region_and_the_claims_gpus_by_uuid(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    env = spec["containerEdits"]["env"]
    assert "TESSERA_LIMITS_FILE=/run/tessera/limits" in env
    assert "TESSERA_USAGE_REGION=/run/tessera/usage" in env
    assert "CUDA_VISIBLE_DEVICES=GPU-A" in env and "NVIDIA_VISIBLE_DEVICES=GPU-A" in env
    assert "SIMGPU_CONFIG=/sim.conf" in env
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert all(d["containerEdits"]["env"] for d in spec["devices"]), "CDI refuses a device without edits"


def test_the_spec_file_is_a_transient_spec_named_by_claim_and_found_again(tmp_path: Path) -> None:
    path = cdi.write(tmp_path, "u1", make_spec(tmp_path))
    assert path.name == "k8s.gpu.tessera.dev-claim_u1.json"
    assert cdi.claim_uids(tmp_path) == ["u1"]
    cdi.remove(tmp_path, "u1")
    cdi.remove(tmp_path, "u1")
    assert cdi.claim_uids(tmp_path) == []
