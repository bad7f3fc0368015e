"""This node's ResourceSlice: built from the devices, kept published whatever happens to it.

One pool per node (named after it) in one slice. Anyone may delete the slice — the kubelet deletes
every slice of its node when it starts, and 30 s after the driver's last registration goes — so the
publisher watches its node's slices and puts ours back within moments; a change of devices (a GPU
tainted or untainted) is written with the pool's generation bumped, so the scheduler never mixes
old and new content. Slices of our pool that are not ours (a renamed node, an older layout) are
deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import raw_json
from tessera.names import DRIVER_NAME
from tessera.watching import Reachability, watch_forever

log = logging.getLogger(__name__)


DEVICES_HASH_ANNOTATION = f"{DRIVER_NAME}/devices-sha256"
"""What the slice was written from: the API server rewrites quantities in canonical form
("16777216000" comes back as "16777216k"), so comparing specs would see a change on every resync."""


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver}"


def devices_hash(devices: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(list(devices), sort_keys=True).encode()).hexdigest()


def slice_object(
    node: str, node_uid: str, driver: str, devices: Sequence[Mapping[str, Any]], generation: int
) -> dict[str, Any]:
    """The slice for ``devices``, owned by the Node (deleted with it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node, driver),
            "annotations": {DEVICES_HASH_ANNOTATION: devices_hash(devices)},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


class SlicePublisher:
    """Publishes ``devices`` (set with :meth:`set_devices`) and keeps them published."""

    def __init__(
        self,
        resource: client.ResourceV1Api,
        core: client.CoreV1Api,
        node: str,
        driver: str,
        reachability: Reachability | None = None,
    ) -> None:
        self._resource = resource
        self._reachability = reachability
        self._core = core
        self._node = node
        self._driver = driver
        self._devices: list[Mapping[str, Any]] | None = None
        self._generation = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.published = threading.Event()
        """Set once our slice has been seen in the API with the current devices."""

    def set_devices(self, devices: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            changed = self._devices != list(devices)
            self._devices = list(devices)
        if changed:
            self.published.clear()
            self._wake.set()

    def run(self, stop: threading.Event, resync_interval: float) -> None:
        """Reconcile whenever our node's slices change, the devices change, or every
        ``resync_interval`` seconds; failures are retried with backoff."""
        watcher = threading.Thread(
            target=watch_forever,
            args=(self._resource.list_resource_slice, self._on_event, stop, "ResourceSlices"),
            kwargs={"field_selector": f"spec.nodeName={self._node}", "reachability": self._reachability},
            name="slice-watch",
            daemon=True,
        )
        watcher.start()
        backoff = 0.5
        while not stop.is_set():
            self._wake.clear()
            try:
                self.reconcile()
                backoff = 0.5
                self._wake.wait(resync_interval)
            except Exception as error:
                log.warning(
                    "publishing ResourceSlice of %s failed (%s); retrying in %.1fs",
                    self._node,
                    error,
                    backoff,
                )
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        watcher.join(timeout=5)

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "SYNCED" or obj.get("spec", {}).get("driver") == self._driver:
            self._wake.set()

    def reconcile(self) -> None:
        """Make the API hold exactly our one slice with the current devices."""
        with self._lock:
            devices = self._devices
        if devices is None:
            return
        name = slice_name(self._node, self._driver)
        selector = f"spec.nodeName={self._node},spec.driver={self._driver}"
        listed = raw_json(self._resource.list_resource_slice(field_selector=selector, _preload_content=False))
        current = None
        for item in listed.get("items") or []:
            self._generation = max(self._generation, int(item["spec"]["pool"].get("generation", 0)))
            if item["metadata"]["name"] == name:
                current = item
            else:
                log.info(
                    "deleting ResourceSlice %s: not this driver's current slice for %s",
                    item["metadata"]["name"],
                    self._node,
                )
                self._delete(item["metadata"]["name"])
        annotations = (current or {}).get("metadata", {}).get("annotations") or {}
        if current is not None and annotations.get(DEVICES_HASH_ANNOTATION) == devices_hash(devices):
            self.published.set()
            return
        self._generation += 1
        body = slice_object(self._node, self._node_uid(), self._driver, devices, self._generation)
        if current is None:
            try:
                self._resource.create_resource_slice(client.V1ResourceSlice.model_validate(body))
            except ApiException as error:
                if error.status != 409:  # someone (our last loop) created it: reconcile again
                    raise
                self._wake.set()
                return
            log.info(
                "published ResourceSlice %s with %d GPUs (pool generation %d)",
                name,
                len(devices),
                self._generation,
            )
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self._resource.replace_resource_slice(name, client.V1ResourceSlice.model_validate(body))
            log.info("updated ResourceSlice %s (pool generation %d)", name, self._generation)
        self.published.set()

    def _node_uid(self) -> str:
        node = raw_json(self._core.read_node(self._node, _preload_content=False))
        return str(node["metadata"]["uid"])

    def _delete(self, name: str) -> None:
        try:
            self._resource.delete_resource_slice(name)
        except ApiException as error:
            if error.status != 404:
                raise
