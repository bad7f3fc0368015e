"""Which containers on this node use which ResourceClaim, and which runtime container ID is which
container: a watched, cached index of the node's pods.

The exporter labels every per-container series with namespace, pod and container, but a claim's
folder knows only the claim. A pod names its claims in ``spec.resourceClaims`` (directly, or through
a template whose generated name appears in ``status.resourceClaimStatuses``) and each container
picks some of them in ``resources.claims``. Reading that from one watch of the pods bound to this
node keeps a scrape free of API calls (a GET per scrape would load the API server with every
node's scrape interval), and a pod that is deleted or has finished drops out at the next event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.watching import watch_forever

_FINISHED = ("Succeeded", "Failed")
"""Phases in which no container of the pod runs any more: its series go."""


@dataclass(frozen=True, order=True)
class ContainerRef:
    """One container of a running pod that uses a claim."""

    namespace: str
    pod: str
    container: str


def containers_by_claim(pod: Mapping[str, Any]) -> dict[tuple[str, str], list[ContainerRef]]:
    """(namespace, claim name) -> the pod's containers that use that claim, in spec order.

    A template-made claim whose name the status does not carry yet is left out: no container can
    have started on it before the kubelet prepared it, and by then the status names it."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in _FINISHED or (meta.get("deletionTimestamp") and not _running(status)):
        return {}
    namespace, pod_name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    }
    claim_of: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if name:
            claim_of[str(entry.get("name"))] = str(name)
    out: dict[tuple[str, str], list[ContainerRef]] = {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        used = {str(c.get("name")) for c in (container.get("resources") or {}).get("claims") or []}
        for entry_name in sorted(used):
            claim = claim_of.get(entry_name)
            if claim is None:
                continue
            refs = out.setdefault((namespace, claim), [])
            ref = ContainerRef(namespace, pod_name, str(container.get("name", "")))
            if ref not in refs:
                refs.append(ref)
    return out


def containers_by_id(pod: Mapping[str, Any]) -> dict[tuple[str, str], ContainerRef]:
    """(pod UID, container ID) -> the container, for every container the kubelet reports started.

    The container ID is what the runtime named it (``containerd://<id>`` in the status, the bare
    ``<id>`` in its cgroup's path): the fact the kernel keeps about a process, which the exporter
    matches NVML's processes against. Written by the kubelet, never by the pod."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    uid, namespace, name = str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))
    out: dict[tuple[str, str], ContainerRef] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or []:
            _, sep, container_id = str(entry.get("containerID") or "").partition("://")
            if uid and sep and container_id:
                out[(uid, container_id)] = ContainerRef(namespace, name, str(entry.get("name", "")))
    return out


def _running(status: Mapping[str, Any]) -> bool:
    """A pod being deleted still has running containers until they stop; keep it until then."""
    return any("running" in (c.get("state") or {}) for c in status.get("containerStatuses") or [])


class ContainerIndex:
    """Claims -> containers for the pods bound to one node, kept by a watch (``run``)."""

    def __init__(self, list_pods: Callable[..., Any], node_name: str) -> None:
        self._list_pods = list_pods
        self._node = node_name
        self._pods: dict[str, dict[tuple[str, str], list[ContainerRef]]] = {}
        self._ids: dict[str, dict[tuple[str, str], ContainerRef]] = {}
        self._by_claim: dict[tuple[str, str], list[ContainerRef]] = {}
        self._by_id: dict[tuple[str, str], ContainerRef] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        """Set once the first list has arrived: before it, no claim has containers."""

    def run(self, stop: threading.Event) -> None:
        watch_forever(
            self._list_pods, self.on_event, stop, "Pods", field_selector=f"spec.nodeName={self._node}"
        )

    def on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """The watch's handler (see tessera.watching.Handler); public so tests can feed it."""
        with self._lock:
            if kind == "SYNCED":
                self._pods = {_uid(p): containers_by_claim(p) for p in obj["items"]}
                self._ids = {_uid(p): containers_by_id(p) for p in obj["items"]}
            elif kind == "DELETED":
                self._pods.pop(_uid(obj), None)
                self._ids.pop(_uid(obj), None)
            else:
                self._pods[_uid(obj)] = containers_by_claim(obj)
                self._ids[_uid(obj)] = containers_by_id(obj)
            merged: dict[tuple[str, str], list[ContainerRef]] = {}
            for claims in self._pods.values():
                for key, refs in claims.items():
                    merged.setdefault(key, []).extend(refs)
            self._by_claim = {key: sorted(refs) for key, refs in merged.items()}
            self._by_id = {key: ref for ids in self._ids.values() for key, ref in ids.items()}
        if kind == "SYNCED":
            self.synced.set()

    def containers(self, namespace: str, claim: str) -> Sequence[ContainerRef]:
        """The running containers that use claim ``namespace/claim`` (none if no pod here does)."""
        with self._lock:
            return self._by_claim.get((namespace, claim), [])

    def container(self, pod_uid: str, container_id: str) -> ContainerRef | None:
        """The container the runtime named ``container_id`` in pod ``pod_uid`` (None if no pod of
        this node reports it)."""
        with self._lock:
            return self._by_id.get((pod_uid, container_id))


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))
