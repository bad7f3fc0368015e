"""Make sure a ResourceClaimTemplate exists before the pod that references it is admitted.

Create, and treat AlreadyExists as success: templates are named by the hash of their spec, so an
existing one with that name is the same shape. Names known to exist are remembered for a while so a
warm webhook makes no API call per pod; after ``ttl`` seconds the next pod checks again, which
brings back a template somebody deleted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from tessera.kube import create_if_absent


class TemplateStore:
    """Creates templates once per namespace and name; thread-safe."""

    def __init__(
        self, api: client.ApiClient, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._resource = client.ResourceV1Api(api)
        self._ttl = ttl
        self._clock = clock
        self._known: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def ensure(self, template: Mapping[str, Any]) -> bool:
        """Create ``template`` unless it is known to exist; True if the API was called. Raises
        ApiException on failures other than AlreadyExists."""
        namespace = template["metadata"]["namespace"]
        key = (namespace, template["metadata"]["name"])
        now = self._clock()
        with self._lock:
            if self._known.get(key, -1.0) > now:
                return False
        create_if_absent(
            self._resource.create_namespaced_resource_claim_template,
            namespace,
            client.V1ResourceClaimTemplate.model_validate(dict(template)),
            _preload_content=False,
        )
        with self._lock:
            self._known[key] = now + self._ttl
        return True
