"""A watched cache of the driver's ResourceSlices, reduced to a Fleet on every change.

Admission reads the current Fleet (one attribute read) and never lists slices per request; the
list-then-watch loop, its resourceVersion handling and backoff are ``tessera.watching``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from tessera.names import DRIVER_NAME
from tessera.watching import WatchThread
from tessera.webhook.fleet import Fleet, fleet_from_slices


class SliceCache:
    """Keeps ``fleet`` current from a watch of ResourceSlices with ``spec.driver`` = ours."""

    def __init__(self, api: client.ApiClient) -> None:
        self._resource = client.ResourceV1Api(api)
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._watch = WatchThread(
            self._resource.list_resource_slice,
            self._handle,
            "ResourceSlices",
            "slice-cache",
            field_selector=f"spec.driver={DRIVER_NAME}",
        )
        self.synced = threading.Event()
        self.fleet = Fleet(synced=False)

    def _handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "SYNCED":
            self._slices = {item["metadata"]["name"]: item for item in obj["items"]}
        elif kind == "DELETED":
            self._slices.pop(obj["metadata"]["name"], None)
        else:
            self._slices[obj["metadata"]["name"]] = obj
        self.fleet = fleet_from_slices(self._slices.values())  # one assignment: readers never see half
        if kind == "SYNCED":
            self.synced.set()

    def start(self) -> None:
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
