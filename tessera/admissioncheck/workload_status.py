"""What a Kueue Workload's status says, as the decision pass reads it: its conditions, our check's
state on it, and the order Kueue would take it in; pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

READY, PENDING, REJECTED = "Ready", "Pending", "Rejected"
"""The states an admission check writes on a Workload."""


def condition(workload: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def check_state(workload: Mapping[str, Any], check: str) -> Mapping[str, Any] | None:
    states: list[Mapping[str, Any]] = (workload.get("status") or {}).get("admissionChecks") or []
    return next((state for state in states if state.get("name") == check), None)


def live(workload: Mapping[str, Any]) -> bool:
    return condition(workload, "QuotaReserved") and not condition(workload, "Finished")


def priority_order(workload: Mapping[str, Any]) -> tuple[int, str, str]:
    """Higher priority first, then older first (as Kueue orders its queues)."""
    spec = workload.get("spec") or {}
    metadata = workload.get("metadata") or {}
    return (-int(spec.get("priority") or 0), metadata.get("creationTimestamp", ""), metadata.get("name", ""))
