"""What a Workload's status says: the order Kueue takes Workloads in, our check's state, liveness."""

from __future__ import annotations

from typing import Any

from tessera.admissioncheck.workload_status import check_state, live, priority_order


def test_higher_priority_then_older_workloads_are_decided_first() -> None:
    def wl(name: str, priority: int, created: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"priority": priority}}

    order = sorted(
        [
            wl("batch-old", 100, "2026-01-01T00:00:00Z"),
            wl("prod", 1000, "2026-01-03T00:00:00Z"),
            wl("batch-new", 100, "2026-01-02T00:00:00Z"),
        ],
        key=priority_order,
    )
    assert [w["metadata"]["name"] for w in order] == ["prod", "batch-old", "batch-new"]


def test_a_workload_is_live_with_quota_reserved_until_finished_and_our_check_is_found_by_name() -> None:
    status: dict[str, Any] = {
        "conditions": [{"type": "QuotaReserved", "status": "True"}],
        "admissionChecks": [{"name": "other", "state": "Ready"}, {"name": "gpu", "state": "Pending"}],
    }
    workload = {"status": status}
    assert live(workload)
    assert check_state(workload, "gpu") == {"name": "gpu", "state": "Pending"}
    assert check_state(workload, "missing") is None
    status["conditions"].append({"type": "Finished", "status": "True"})
    assert not live(workload)
