"""Our AdmissionChecks' Active condition: True with a reason while this controller runs, written only
when it differs from what the object already says (Kueue treats a check that is not Active as
unusable, and holds the ClusterQueues that name it)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.admissioncheck.inventory import KUEUE_GROUP, KUEUE_VERSION

log = logging.getLogger(__name__)

ACTIVE = "Active"
REASON = "ControllerRunning"


def desired_condition(controller_name: str) -> dict[str, str]:
    return {
        "type": ACTIVE,
        "status": "True",
        "reason": REASON,
        "message": f"{controller_name} is running and decides this check",
    }


def needs_write(check: Mapping[str, Any], desired: Mapping[str, str]) -> bool:
    """Whether the check's Active condition differs from ``desired`` in status, reason or message."""
    for condition in (check.get("status") or {}).get("conditions") or []:
        if condition.get("type") == desired["type"]:
            return any(condition.get(k) != desired[k] for k in ("status", "reason", "message"))
    return True


def sync_active(
    custom: client.CustomObjectsApi,
    checks: Mapping[str, Mapping[str, Any]],
    controller_name: str,
    field_manager: str,
) -> int:
    """Write Active on each of our checks that does not say it yet; returns how many were written."""
    desired = desired_condition(controller_name)
    written = 0
    for name, check in checks.items():
        if (check.get("spec") or {}).get("controllerName") != controller_name or not needs_write(
            check, desired
        ):
            continue
        generation = (check.get("metadata") or {}).get("generation", 0)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {
                "conditions": [{**desired, "lastTransitionTime": now, "observedGeneration": generation}]
            },
        }
        try:
            custom.patch_cluster_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                "admissionchecks",
                name,
                body,
                field_manager=field_manager,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as error:
            log.warning("marking AdmissionCheck %s Active failed: %s %s", name, error.status, error.reason)
            continue
        log.info("AdmissionCheck %s: Active (%s)", name, REASON)
        written += 1
    return written
