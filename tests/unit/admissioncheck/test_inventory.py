"""What the watched objects say about free capacity: the driver's GPUs (not the tainted ones), what
allocated claims take, and whether a pod's shares are already counted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.admissioncheck.inventory import allocated_usage, gpus_from_slices, is_placed, pod_record
from tessera.quantity import GiB
from testbed.queue_bed import gpu_devices


def a_slice(node: str, devices: list[dict[str, Any]], driver: str = "gpu.tessera.dev") -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices}}


def test_the_drivers_devices_become_gpus_and_tainted_or_foreign_ones_do_not() -> None:
    devices = gpu_devices("node-a", [80, 40])
    devices[1]["taints"] = [{"key": "gpu.tessera.dev/unhealthy", "effect": "NoSchedule"}]
    gpus = gpus_from_slices(
        [a_slice("node-a", devices), a_slice("node-b", gpu_devices("node-b", [80]), "other")]
    )
    assert [(g.node, g.memory, g.cores, g.uuid) for g in gpus] == [("node-a", 80 * GiB, 100, "GPU-node-a-0")]
    assert gpus[0].product == "NVIDIA A100-SXM4-80GB"


def taint_rule(effect: str, **selector: str) -> dict[str, Any]:
    """A DeviceTaintRule as docs/driver.md writes one, selecting by ``selector`` (driver, pool, device)."""
    taint = {"key": "gpu.tessera.dev/cordoned", "value": "maintenance", "effect": effect}
    return {"metadata": {"name": "cordon"}, "spec": {"deviceSelector": selector, "taint": taint}}


def test_a_gpu_a_device_taint_rule_cordons_with_noschedule_or_noexecute_is_never_free() -> None:
    slices = [
        a_slice("node-a", gpu_devices("node-a", [80, 80])),
        a_slice("node-b", gpu_devices("node-b", [80])),
    ]
    names = [d["name"] for d in gpu_devices("node-a", [80, 80])]
    for effect in ("NoSchedule", "NoExecute"):
        rule = taint_rule(effect, driver="gpu.tessera.dev", pool="node-a", device=names[0])
        gpus = gpus_from_slices(slices, [rule])
        assert [g.uuid for g in gpus] == ["GPU-node-a-1", "GPU-node-b-0"], effect


def test_a_device_taint_rule_selects_by_each_field_it_sets_and_an_empty_selector_takes_every_gpu() -> None:
    slices = [
        a_slice("node-a", gpu_devices("node-a", [80, 80])),
        a_slice("node-b", gpu_devices("node-b", [80])),
    ]

    def free(rule: dict[str, Any]) -> list[str]:
        return [g.uuid for g in gpus_from_slices(slices, [rule])]

    assert free(taint_rule("NoSchedule", pool="node-a")) == ["GPU-node-b-0"]
    assert free(taint_rule("NoSchedule", driver="other.example.com")) == [
        "GPU-node-a-0",
        "GPU-node-a-1",
        "GPU-node-b-0",
    ], "another driver's rule"
    assert free(taint_rule("NoSchedule")) == [], "an empty selector selects every device"
    no_selector = taint_rule("NoSchedule")
    del no_selector["spec"]["deviceSelector"]
    assert len(free(no_selector)) == 3, "no selector selects no device"


def test_a_device_taint_rule_with_effect_none_is_a_dry_run_that_leaves_the_gpu_free() -> None:
    slices = [a_slice("node-a", gpu_devices("node-a", [80]))]
    assert [g.uuid for g in gpus_from_slices(slices, [taint_rule("None", pool="node-a")])] == ["GPU-node-a-0"]


def claim(device: str, memory: str, cores: str, allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [
                    {
                        "driver": "gpu.tessera.dev",
                        "pool": "node-a",
                        "device": device,
                        "consumedCapacity": {"memory": memory, "cores": cores},
                    }
                ]
            }
        }
    return {"metadata": {"name": device, "namespace": "ns"}, "status": status}


def test_allocated_claims_add_up_per_gpu_and_unallocated_ones_take_nothing() -> None:
    used = allocated_usage(
        [claim("gpu-0", "10Gi", "30"), claim("gpu-0", "2Gi", "0"), claim("gpu-1", "1Gi", "1", False)]
    )
    assert used == {("node-a", "gpu-0"): (12 * GiB, 30)}


def test_a_live_pod_counts_as_placed_once_all_its_claims_are_allocated() -> None:
    def pod(claims: Sequence[str] = (), named: Sequence[str] = (), **status: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {"nodeName": status.pop("node")} if "node" in status else {}
        spec["resourceClaims"] = [{"name": f"r{i}", "resourceClaimName": n} for i, n in enumerate(named)]
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": n} for n in claims]
        return {
            "metadata": {"uid": "u", "namespace": "ns", "ownerReferences": [{"uid": "job"}]},
            "spec": spec,
            "status": status,
        }

    claims = {("ns", "c0"): claim("gpu-0", "1Gi", "1"), ("ns", "c1"): claim("gpu-1", "1Gi", "1", False)}
    assert not is_placed(pod_record(pod(["c0", "c1"])), claims), "one claim is not allocated yet"
    assert not is_placed(pod_record(pod(["c1"], node="node-a")), claims), (
        "bound, but its allocation not seen yet: its shares are still counted as reserved"
    )
    assert is_placed(pod_record(pod(["c0"])), claims)
    assert is_placed(pod_record(pod(named=["c0"])), claims), "a claim named in the spec counts too"
    assert not is_placed(pod_record(pod(["c0"], phase="Succeeded")), claims), (
        "a finished pod holds nothing; whether its Workload needs another is Kueue's reclaimablePods"
    )
    assert not is_placed(pod_record(pod(["gone"], phase="Failed")), claims)
    assert not is_placed(pod_record(pod()), claims) and is_placed(pod_record(pod(node="node-a")), claims), (
        "a pod without claims has no shares: placed once bound"
    )
    assert pod_record(pod()).owners == frozenset({"job"})
