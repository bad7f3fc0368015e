"""A GPU becomes a Device whose capacities, policy and attributes the scheduler and users rely on."""

from __future__ import annotations

from dataclasses import replace

from tessera.driver import devices
from tessera.driver.devices import DeviceTaint
from tessera.names import CORES_CAPACITY, MEMORY_CAPACITY, UNHEALTHY_TAINT, UNMONITORED_TAINT
from tessera.quantity import MiB
from tests.unit.driver.driver_samples import gpu


def test_a_gpu_is_named_by_its_uuid_so_renumbering_never_moves_a_share() -> None:
    first, renumbered = gpu(index=0), gpu(index=3, uuid=gpu(index=0).uuid)
    assert devices.device_name(first) == devices.device_name(renumbered)
    assert devices.device_name(first) == "gpu-00000000-1111-2222-3333-444455556666"
    assert devices.device_name(gpu(index=1)) != devices.device_name(first)


def test_memory_is_published_in_bytes_rounded_down_to_the_one_mebibyte_step() -> None:
    odd = gpu(memory_bytes=80 * 1024 * MiB + 12345)
    memory = devices.device(odd)["capacity"][MEMORY_CAPACITY]
    assert memory["value"] == str(80 * 1024 * MiB)
    assert memory["requestPolicy"]["validRange"] == {
        "min": "0",
        "max": str(80 * 1024 * MiB),
        "step": str(MiB),
    }


def test_a_claim_naming_one_dimension_takes_none_of_the_other() -> None:
    """The defaults are 0, never the whole GPU: a memory-only claim does not take every core, and a
    cores-only claim does not take all memory (HAMi's exclusive-by-accident trap)."""
    capacity = devices.device(gpu())["capacity"]
    assert capacity[MEMORY_CAPACITY]["requestPolicy"]["default"] == "0"
    assert capacity[CORES_CAPACITY]["requestPolicy"]["default"] == "0"
    assert capacity[CORES_CAPACITY]["value"] == "100"
    assert capacity[CORES_CAPACITY]["requestPolicy"]["validRange"] == {"min": "0", "max": "100", "step": "1"}


def test_every_device_can_be_shared() -> None:
    assert devices.device(gpu())["allowMultipleAllocations"] is True


def test_attributes_carry_identity_model_and_versions_in_the_api_forms() -> None:
    attributes = devices.device(gpu(index=2))["attributes"]
    assert attributes["uuid"] == {"string": "GPU-00000002-1111-2222-3333-444455556666"}
    assert attributes["index"] == {"int": 2}
    assert attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attributes["brand"] == {"string": "Nvidia"}
    assert attributes["architecture"] == {"string": "Hopper"}
    assert attributes["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attributes["driverVersion"] == {"version": "550.54.15"}
    assert attributes["cudaDriverVersion"] == {"version": "12.4.0"}
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:03:00.0"}
    assert len(attributes) + 2 <= 32, "attributes plus capacities: at most 32 per device"


def test_an_unhealthy_gpu_is_tainted_no_schedule_with_a_label_safe_reason() -> None:
    lost = DeviceTaint(UNHEALTHY_TAINT, "GPU is lost", "2026-11-30T00:00:00Z")
    unknown = DeviceTaint(UNMONITORED_TAINT, "NVML did not answer within 10 s")
    assert devices.device(gpu(), [lost, unknown])["taints"] == [
        {
            "key": UNHEALTHY_TAINT,
            "value": "GPU-is-lost",
            "effect": "NoSchedule",
            "timeAdded": "2026-11-30T00:00:00Z",
        },
        {"key": UNMONITORED_TAINT, "value": "NVML-did-not-answer-within-10-s", "effect": "NoSchedule"},
    ]
    assert "taints" not in devices.device(gpu())
    long_reason = devices.device(gpu(), [DeviceTaint(UNHEALTHY_TAINT, "x" * 200)])["taints"][0]["value"]
    assert len(long_reason) <= 63


def test_gpus_in_mig_mode_are_not_published_for_sharing() -> None:
    mig = replace(gpu(index=1), mig_enabled=True)
    assert devices.shareable([gpu(index=0), mig, gpu(index=2)]) == [gpu(index=0), gpu(index=2)]
