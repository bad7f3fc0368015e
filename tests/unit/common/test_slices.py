"""The one ResourceSlice reader: what the driver publishes is read back as the same GPUs; foreign and
malformed devices are skipped, never raised; each reader's choice about tainted GPUs is its own and
visible."""

from __future__ import annotations

from typing import Any

from tessera.admissioncheck.inventory import gpus_from_slices
from tessera.driver.devices import DeviceTaint, device, device_name
from tessera.driver.slices import slice_object
from tessera.names import DRIVER_NAME, UNHEALTHY_TAINT
from tessera.quantity import GiB
from tessera.slices import PublishedGpu, published_gpus
from tessera.webhook.fleet import Fleet, fleet_from_slices
from tests.unit.driver.driver_samples import gpu


def published_slice(node: str, devices: list[dict[str, Any]], driver: str = DRIVER_NAME) -> dict[str, Any]:
    return slice_object(node, f"uid-{node}", driver, devices, generation=1)


def test_what_the_driver_publishes_reads_back_as_the_same_gpus() -> None:
    healthy, failing = gpu(0, 80 * GiB + 3), gpu(1, 40 * GiB)
    devices = [
        device(healthy),
        device(failing, [DeviceTaint(UNHEALTHY_TAINT, "XID 79: GPU fell off the bus")]),
    ]

    gpus = published_gpus([published_slice("node-a", devices)])

    assert gpus == [
        PublishedGpu(
            node="node-a",
            pool="node-a",
            name=device_name(healthy),
            uuid=healthy.uuid,
            product="NVIDIA H100 80GB HBM3",
            memory=80 * GiB,
            cores=100,
        ),
        PublishedGpu(
            node="node-a",
            pool="node-a",
            name=device_name(failing),
            uuid=failing.uuid,
            product="NVIDIA H100 80GB HBM3",
            memory=40 * GiB,
            cores=100,
            blocking_taints=(UNHEALTHY_TAINT,),
        ),
    ]
    assert gpus[0].schedulable and not gpus[1].schedulable
    assert gpus[0].key == ("node-a", device_name(healthy))


def test_other_drivers_slices_and_devices_nothing_can_be_allocated_from_are_skipped() -> None:
    good = device(gpu(0))
    no_memory = {**device(gpu(1)), "capacity": {"cores": {"value": "100"}}}
    bad_quantity = {**device(gpu(2)), "capacity": {"memory": {"value": "lots"}}}
    not_a_mapping = {**device(gpu(3)), "capacity": {"memory": "80Gi"}}
    nameless = {key: value for key, value in device(gpu(4)).items() if key != "name"}
    slices = [
        published_slice("node-a", [good, no_memory, bad_quantity, not_a_mapping, nameless]),
        published_slice("node-b", [device(gpu(5))], driver="other.example.com"),
        {"spec": None},
    ]

    assert [g.name for g in published_gpus(slices)] == [device_name(gpu(0))]


def test_only_taints_that_stop_new_allocations_block_a_gpu() -> None:
    def tainted(effect: str) -> dict[str, Any]:
        return {**device(gpu(0)), "taints": [{"key": "example.com/maintenance", "effect": effect}]}

    assert not published_gpus([published_slice("a", [tainted("NoExecute")])])[0].schedulable
    assert not published_gpus([published_slice("a", [tainted("NoSchedule")])])[0].schedulable
    assert published_gpus([published_slice("a", [tainted("None")])])[0].schedulable


def test_a_slice_without_a_cores_capacity_offers_the_whole_gpus_time() -> None:
    plain = device(gpu(0))
    del plain["capacity"]["cores"]
    assert published_gpus([published_slice("a", [plain])])[0].cores == 100


def test_the_webhook_counts_a_tainted_gpu_and_the_admission_check_does_not() -> None:
    """A refusal at pod creation is final while an unhealthy GPU may recover, so the webhook still
    counts it; the admission check decides what fits now, and the scheduler would not use it."""
    devices = [device(gpu(0), [DeviceTaint(UNHEALTHY_TAINT, "lost")]), device(gpu(1, 40 * GiB))]
    slices = [published_slice("node-a", devices)]

    assert fleet_from_slices(slices) == Fleet(memory_sizes=(80 * GiB, 40 * GiB), max_gpus_per_node=2)
    assert [(g.name, g.memory) for g in gpus_from_slices(slices)] == [(device_name(gpu(1)), 40 * GiB)]
