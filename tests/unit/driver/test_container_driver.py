"""How containers reach the real driver: NVIDIA's toolkit devices when present, else our own mounts,
and never a spec that silently lacks a GPU's device node."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from tessera.driver.config import DriverSource
from tessera.driver.container_driver import DriverSourceError, resolve


def libraries(tmp_path: Path) -> Path:
    folder = tmp_path / "lib"
    folder.mkdir()
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        (folder / name).write_text("")
    return folder


def test_with_nvidias_toolkit_spec_present_auto_names_its_device_per_gpu(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.json").write_text(
        json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": []})
    )
    driver = resolve(DriverSource(mode="auto", toolkit_library_dir=Path("/usr/lib64")), [cdi])
    assert driver.toolkit_ids(["GPU-1"]) == ["nvidia.com/gpu=GPU-1"]
    assert driver.libraries == {}
    assert driver.container_cuda == PurePosixPath("/usr/lib64/libcuda.so.1")
    assert driver.gpu_device_nodes(0) == (), "the toolkit's device brings the node"


def test_without_the_toolkit_auto_mounts_the_libraries_itself(tmp_path: Path) -> None:
    lib = libraries(tmp_path)
    driver = resolve(DriverSource(mode="auto", host_library_dir=lib, device_dir=tmp_path / "dev"), [tmp_path])
    assert driver.toolkit_ids(["GPU-1"]) == []
    assert driver.libraries == {
        PurePosixPath("/run/tessera/driver/libcuda.so.1"): lib / "libcuda.so.1",
        PurePosixPath("/run/tessera/driver/libnvidia-ml.so.1"): lib / "libnvidia-ml.so.1",
    }
    assert driver.container_nvml == PurePosixPath("/run/tessera/driver/libnvidia-ml.so.1")


def test_own_mounts_add_the_control_and_gpu_device_nodes_that_exist(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia3"):
        (dev / name).touch()
    driver = resolve(DriverSource(mode="own", host_library_dir=libraries(tmp_path), device_dir=dev), [])
    assert driver.common_device_nodes == (dev / "nvidiactl", dev / "nvidia-uvm")
    assert driver.gpu_device_nodes(3) == (dev / "nvidia3",)


def test_a_missing_gpu_device_node_with_the_kernel_driver_loaded_is_an_error_not_an_empty_spec(
    tmp_path: Path,
) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    driver = resolve(DriverSource(mode="own", host_library_dir=libraries(tmp_path), device_dir=dev), [])
    with pytest.raises(DriverSourceError, match=r"nvidia0 is missing although the NVIDIA driver is loaded"):
        driver.gpu_device_nodes(0)


def test_missing_driver_libraries_are_refused_at_start_with_the_flag_to_set(tmp_path: Path) -> None:
    with pytest.raises(DriverSourceError, match=r"libcuda.so.1 does not exist: set .*--driver-library-dir"):
        resolve(DriverSource(mode="own", host_library_dir=tmp_path / "nowhere"), [])
