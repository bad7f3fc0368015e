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
        {PurePosixPath("/run/tessera/driver/libcuda.so.1"): Path("/host/libcuda.so.1")},
        [Path("/dev/nvidiactl")],
        [("SIMGPU_CONFIG", "/sim.conf")],
        [Path("/sim")],
    )


def test_two_shares_of_one_gpu_are_two_distinct_cdi_devices(tmp_path: Path) -> None:
    names = [d["name"] for d in make_spec(tmp_path)["devices"]]
    assert names == ["u1-gpu-a-s1", "u1-gpu-a-s2"]
    assert cdi.CdiDevice(names[0], "GPU-A").qualified_name == "k8s.gpu.tessera.dev/claim=u1-gpu-a-s1"


def test_the_claims_folder_is_one_read_only_mount_and_the_usage_region_a_writable_one_inside_it(
    tmp_path: Path,
) -> None:
    """The claim's folder (shim, limits file) is mounted whole and read-only at /run/tessera - one
    mount point, which nothing in the container can rename - with the usage region and the driver's
    libraries mounted over their own files inside it, after it."""
    mounts = make_spec(tmp_path)["containerEdits"]["mounts"]
    by_path = {m["containerPath"]: m for m in mounts}
    assert by_path["/run/tessera"]["hostPath"] == str(tmp_path / "claims/u1")
    assert "ro" in by_path["/run/tessera"]["options"]
    assert by_path["/run/tessera/usage"]["hostPath"] == str(tmp_path / "claims/u1/usage")
    assert "rw" in by_path["/run/tessera/usage"]["options"]
    assert "ro" in by_path["/etc/ld.so.preload"]["options"]
    assert by_path["/run/tessera/driver/libcuda.so.1"]["hostPath"] == "/host/libcuda.so.1"
    assert "rw" in by_path["/sim"]["options"]
    order = [m["containerPath"] for m in mounts]
    assert order.index("/run/tessera") < order.index("/run/tessera/usage")
    assert order.index("/run/tessera") < order.index("/run/tessera/driver/libcuda.so.1")
    assert not {"/run/tessera/limits", "/run/tessera/shim"} & set(by_path), "inside the folder's mount"


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
