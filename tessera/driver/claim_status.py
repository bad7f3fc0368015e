"""What the driver says in the ResourceClaim itself: a Ready condition on each of its shares.

The kubelet puts a failed prepare's error in the pod's events; writing it into the claim as well
(status.devices, one entry per share, owned by this driver) leaves the reason where `kubectl get
resourceclaim -o yaml` shows it, after the events have expired. Success is reported too (Ready=True),
as the DRA API asks of drivers. Writes are server-side applies under this node's field manager, so
they never disturb other drivers' entries, and they are made in the background: a prepare never
waits for them, and a failed write is logged, not retried. Only the latest state of each claim
waits to be written, at most ``QUEUE_CLAIMS`` claims wait, and stopping drops what waits
(tessera/driver/latest_queue.py): with the API server away, a backlog would otherwise outlive the
pod's grace period and the kubelet would kill the daemon mid-stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from tessera.driver.latest_queue import LatestQueue

log = logging.getLogger(__name__)

READY = "Ready"
PREPARED = "Prepared"
PREPARE_FAILED = "PrepareFailed"
_MESSAGE_MAX = 32768  # metav1.Condition's message limit

QUEUE_CLAIMS = 1024
"""Claims whose status may wait to be written; past this the longest-waiting is dropped. Far more
claims than one node prepares between two writes while the API server answers."""

CLOSE_WAIT = 1.0
"""Seconds ``close`` waits for a write already in flight; the writer thread is a daemon thread, so a
write the server does not answer ends with the process, within its own timeout (tessera/kube.py)."""


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


def status_apply(
    claim: Mapping[str, Any], driver: str, pool: str, problem: str | None, now: datetime
) -> dict[str, Any] | None:
    """The server-side apply that writes the claim's entries for ``driver`` on ``pool`` (None when the
    claim has none there): pure."""
    entries = device_statuses(claim, driver, pool, problem, now)
    if not entries:
        return None
    meta = claim["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        "status": {"devices": entries},
    }


class ClaimStatusWriter:
    def __init__(
        self, resource: client.ResourceV1Api, driver: str, node: str, capacity: int = QUEUE_CLAIMS
    ) -> None:
        self._resource = resource
        self._driver = driver
        self._pool = node
        self._field_manager = f"{driver}/{node}"
        self._queue: LatestQueue[str, tuple[Mapping[str, Any], str | None]] = LatestQueue(capacity)
        # One writer: the writes of one claim land in the order they were reported.
        self._writer = threading.Thread(target=self._drain, name="claim-status", daemon=True)
        self._writer.start()

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Drop the statuses still waiting and wait up to ``timeout`` for the write in flight."""
        if dropped := self._queue.close():
            log.warning("stopping: %d ResourceClaim statuses were not written", dropped)
        self._writer.join(timeout)

    def report(self, claim: Mapping[str, Any], problem: str | None) -> None:
        """Record, in the background, whether the claim's shares on this node are ready."""
        dropped = self._queue.put(claim["metadata"]["uid"], (claim, problem))
        if dropped is not None:
            log.warning(
                "%d ResourceClaim statuses wait to be written; dropped the oldest (claim UID %s)",
                len(self._queue),
                dropped,
            )

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            claim, problem = item[1]
            try:
                self._write(claim, problem)
            except Exception as error:  # best effort: the pod's events carry the same sentence
                meta = claim.get("metadata") or {}
                log.warning(
                    "cannot record the status of ResourceClaim %s/%s: %s",
                    meta.get("namespace"),
                    meta.get("name"),
                    error,
                )

    def _write(self, claim: Mapping[str, Any], problem: str | None) -> None:
        body = status_apply(claim, self._driver, self._pool, problem, datetime.now(UTC))
        if body is None:
            return
        meta = body["metadata"]
        self._resource.patch_namespaced_resource_claim_status(
            meta["name"],
            meta["namespace"],
            body,
            field_manager=self._field_manager,
            force=True,
            _content_type="application/apply-patch+yaml",
            _preload_content=False,
        )
