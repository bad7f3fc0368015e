"""What the driver says in the ResourceClaim itself: a Ready condition on each of its shares.

The kubelet puts a failed prepare's error in the pod's events; writing it into the claim as well
(status.devices, one entry per share, owned by this driver) leaves the reason where `kubectl get
resourceclaim -o yaml` shows it, after the events have expired. Success is reported too (Ready=True),
as the DRA API asks of drivers. Writes are server-side applies under this node's field manager, so
they never disturb other drivers' entries, and they are made in the background: a prepare never
waits for them, and a failed write is logged, not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)

READY = "Ready"
PREPARED = "Prepared"
PREPARE_FAILED = "PrepareFailed"
_MESSAGE_MAX = 32768  # metav1.Condition's message limit


def device_statuses(
    claim: Mapping[str, Any], driver: str, pool: str, problem: str | None, now: datetime
) -> list[dict[str, Any]]:
    """One status entry per share of ``driver`` on ``pool`` in the claim's allocation: pure."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    condition = {
        "type": READY,
        "status": "False" if problem else "True",
        "reason": PREPARE_FAILED if problem else PREPARED,
        "message": (problem or "limits file, usage region, shim and CDI spec written on the node")[
            :_MESSAGE_MAX
        ],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    entries = []
    for result in results:
        if result.get("driver") != driver or result.get("pool") != pool:
            continue
        entry: dict[str, Any] = {
            "driver": driver,
            "pool": pool,
            "device": result["device"],
            "conditions": [condition],
        }
        if result.get("shareID"):
            entry["shareID"] = result["shareID"]
        entries.append(entry)
    return entries


class ClaimStatusWriter:
    def __init__(self, resource: client.ResourceV1Api, driver: str, node: str) -> None:
        self._resource = resource
        self._driver = driver
        self._pool = node
        self._field_manager = f"{driver}/{node}"
        self._writer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="claim-status")

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def report(self, claim: Mapping[str, Any], problem: str | None) -> None:
        """Record, in the background, whether the claim's shares on this node are ready."""
        self._writer.submit(self._write, claim, problem)

    def _write(self, claim: Mapping[str, Any], problem: str | None) -> None:
        meta = claim["metadata"]
        entries = device_statuses(claim, self._driver, self._pool, problem, datetime.now(UTC))
        if not entries:
            return
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "status": {"devices": entries},
        }
        try:
            self._resource.patch_namespaced_resource_claim_status(
                meta["name"],
                meta["namespace"],
                body,
                field_manager=self._field_manager,
                force=True,
                _content_type="application/apply-patch+yaml",
                _preload_content=False,
            )
        except Exception as error:  # best effort: the pod's events carry the same sentence
            log.warning(
                "cannot record the status of ResourceClaim %s/%s: %s", meta["namespace"], meta["name"], error
            )
