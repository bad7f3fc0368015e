"""Kueue Workloads our fit check holds, with the message it wrote; pure.

The admission check writes its reason on the Workload itself (status.admissionChecks[].message,
tessera/admissioncheck/planning.py); this reads it back with the admission check's own readers of a
Workload's status, so "held" means here what it means there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.admissioncheck.cli import CONTROLLER_NAME
from tessera.admissioncheck.workload_status import PENDING, REJECTED, check_state, priority_order


def our_checks(checks: Iterable[Mapping[str, Any]], controller_name: str = CONTROLLER_NAME) -> set[str]:
    """Names of the AdmissionChecks our controller decides."""
    return {
        str(check["metadata"]["name"])
        for check in checks
        if (check.get("spec") or {}).get("controllerName") == controller_name
    }


def held(workloads: Iterable[Mapping[str, Any]], checks: set[str]) -> list[dict[str, Any]]:
    """One entry per Workload whose state on one of ``checks`` is Pending or Rejected, in the order
    Kueue would take them."""
    out = []
    for workload in sorted(workloads, key=priority_order):
        for name in sorted(checks):
            state = check_state(workload, name)
            if state is None or state.get("state") not in (PENDING, REJECTED):
                continue
            metadata = workload.get("metadata") or {}
            out.append(
                {
                    "namespace": str(metadata.get("namespace", "")),
                    "workload": str(metadata.get("name", "")),
                    "check": name,
                    "state": str(state.get("state")),
                    "message": str(state.get("message", "")),
                }
            )
    return out
