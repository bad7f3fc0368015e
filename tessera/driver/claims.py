"""ResourceClaims as prepare needs them: from a watched cache first, from the API on a miss.

Prepare must see the claim's allocation and UID (the proto carries only namespace, name and UID).
A cache kept by one watch answers almost every call without a round trip; a miss (the watch has not
seen the claim yet, or its copy has another UID or no allocation) falls back to one GET, so the
cache can only make prepare faster, never wrong. Only claims with a result for this driver on this
node's pool are kept; the clean-up sweep reads the same cache (tessera/driver/cleanup.py).

The watch is cluster-wide because the API offers nothing narrower: a ResourceClaim's selectable
fields are metadata.name and metadata.namespace only (Kubernetes v1.37), and nothing labels a claim
with the node it is allocated to. So each node's watch carries every claim's changes, and the
cache holds this node's claims only; ``--no-watch-claims`` trades the watch for one GET per prepare.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.driver.allocation import AllocationError
from tessera.kube import raw_json
from tessera.watching import Reachability, watch_forever

log = logging.getLogger(__name__)


class ClaimNotFound(AllocationError):
    pass


class ClaimCache:
    def __init__(
        self,
        resource: client.ResourceV1Api,
        driver: str,
        pool: str,
        reachability: Reachability | None = None,
    ) -> None:
        self._resource = resource
        self._reachability = reachability
        self._driver = driver
        self._pool = pool
        self._claims: dict[str, Mapping[str, Any]] = {}
        self._lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        watch_forever(
            self._resource.list_resource_claim_for_all_namespaces,
            self.on_event,
            stop,
            "ResourceClaims",
            reachability=self._reachability,
        )

    def _ours(self, claim: Mapping[str, Any]) -> bool:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        return any(r.get("driver") == self._driver and r.get("pool") == self._pool for r in results)

    def on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            if kind == "SYNCED":
                self._claims = {c["metadata"]["uid"]: c for c in obj["items"] if self._ours(c)}
            elif kind == "DELETED" or not self._ours(obj):
                self._claims.pop(obj["metadata"]["uid"], None)
            else:
                self._claims[obj["metadata"]["uid"]] = obj

    def get(self, namespace: str, name: str, uid: str) -> Mapping[str, Any]:
        """The claim with this UID, allocated; AllocationError says why not."""
        with self._lock:
            cached = self._claims.get(uid)
        if cached is not None:
            return cached
        log.debug("ResourceClaim %s/%s (%s) is not in the watch cache yet; reading it", namespace, name, uid)
        claim = self.read(namespace, name)
        if claim is None:
            raise ClaimNotFound(f"ResourceClaim {namespace}/{name} does not exist")
        if claim["metadata"]["uid"] != uid:
            raise ClaimNotFound(
                f"ResourceClaim {namespace}/{name} was replaced (UID {claim['metadata']['uid']}, not {uid})"
            )
        return claim

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """One GET (None if the claim does not exist)."""
        try:
            response = self._resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return raw_json(response)
