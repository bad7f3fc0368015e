"""Watched caches of everything a fit decision reads, with the indexes that keep it off the API.

One list-then-watch per kind (``tessera.watching``): our driver's ResourceSlices (the GPUs),
DeviceTaintRules (GPUs an operator cordoned), all ResourceClaims (what is allocated, and which
pods' claims are), ResourceClaimTemplates (what a plain pod's claims will ask), pods (reduced to who
owns them and whether they are placed), Kueue Workloads and our AdmissionChecks. Every change that
can move a decision calls ``on_change``, so the controller re-decides on a watch event, never on a
timer.

Objects are kept as plain JSON (the client's typed models are too slow to build by the thousand);
pods are reduced to a small record on arrival.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tessera.names import CORES_CAPACITY, DRIVER_NAME, MEMORY_CAPACITY
from tessera.quantity import quantity_to_int
from tessera.slices import GpuKey, PublishedGpu, published_gpus, with_taint_rules
from tessera.watching import watch_forever

log = logging.getLogger(__name__)

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"

Key = tuple[str, str]
"""(namespace, name)"""


@dataclass(frozen=True)
class PodRecord:
    """What a decision needs of a pod: who owns it, and what tells whether its GPU shares are
    already counted among allocated claims or gone (see :func:`is_placed`)."""

    uid: str
    namespace: str
    owners: frozenset[str]
    bound: bool
    finished: bool
    claims: tuple[str, ...]
    """The names of the claims the pod uses (generated from templates, or named in its spec)."""
    role_hash: str


def gpus_from_slices(
    slices: Iterable[Mapping[str, Any]], taint_rules: Iterable[Mapping[str, Any]] = ()
) -> list[PublishedGpu]:
    """Our driver's GPUs that can take new shares now: those tainted NoSchedule or NoExecute, in
    their slice (unhealthy, cordoned) or by a DeviceTaintRule, are left out, as the scheduler leaves
    them out (tessera/slices.py)."""
    return [gpu for gpu in with_taint_rules(published_gpus(slices), taint_rules) if gpu.schedulable]


def claim_shares(claim: Mapping[str, Any]) -> Iterator[tuple[GpuKey, int, int]]:
    """(GPU, memory, cores) of each of our driver's results in the claim's allocation (their
    consumedCapacity); a result whose figures are not quantities is skipped."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != DRIVER_NAME:
            continue
        consumed = result.get("consumedCapacity") or {}
        try:
            memory = quantity_to_int(consumed.get(MEMORY_CAPACITY, 0))
            cores = quantity_to_int(consumed.get(CORES_CAPACITY, 0))
        except ValueError:
            continue
        yield (result.get("pool", ""), result.get("device", "")), memory, cores


def allocated_usage(claims: Iterable[Mapping[str, Any]]) -> dict[GpuKey, tuple[int, int]]:
    """Memory and cores taken per GPU by allocated claims (their results' consumedCapacity)."""
    used: dict[GpuKey, tuple[int, int]] = {}
    for claim in claims:
        for key, memory, cores in claim_shares(claim):
            m, c = used.get(key, (0, 0))
            used[key] = (m + memory, c + cores)
    return used


def _claim_allocated(claim: Mapping[str, Any] | None) -> bool:
    return bool(claim and (claim.get("status") or {}).get("allocation"))


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    metadata = pod.get("metadata") or {}
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []]
    named = [c.get("resourceClaimName") for c in spec.get("resourceClaims") or []]
    return PodRecord(
        uid=metadata.get("uid", ""),
        namespace=metadata.get("namespace", ""),
        owners=frozenset(o.get("uid", "") for o in metadata.get("ownerReferences") or []),
        bound=bool(spec.get("nodeName")),
        finished=status.get("phase") in ("Succeeded", "Failed") or bool(metadata.get("deletionTimestamp")),
        claims=tuple(name for name in (*generated, *named) if name),
        role_hash=(metadata.get("annotations") or {}).get("kueue.x-k8s.io/role-hash", ""),
    )


def is_placed(pod: PodRecord, claims: Mapping[Key, Mapping[str, Any]]) -> bool:
    """Whether a live pod's shares are counted among allocated claims: every claim it uses is
    allocated in ``claims``, the same cache the free capacity is computed from. Being bound is not
    enough: the scheduler writes the allocation before it binds, but the two arrive through separate
    watches, and a pod seen bound before its allocation would be counted nowhere for a moment, so a
    decision in that moment would give its shares away. A pod with no claims has no shares; it
    counts as placed once bound. A finished pod is not placed: it holds nothing, and whether its
    Workload still needs a pod in its place is Kueue's ``reclaimablePods`` (planning.less_reclaimable),
    so a failed pod's replacement is reserved again."""
    if pod.finished:
        return False
    if not pod.claims:
        return pod.bound
    return all(_claim_allocated(claims.get((pod.namespace, name))) for name in pod.claims)


class Inventory:
    """The caches. Readers take ``lock`` (or accept a moment's staleness); watch threads write."""

    def __init__(self, api: client.ApiClient, controller_name: str, on_change: Callable[[str], None]) -> None:
        self._resource = client.ResourceV1Api(api)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self.controller_name = controller_name
        self._on_change = on_change
        self.lock = threading.RLock()
        self.slices: dict[str, Mapping[str, Any]] = {}
        self.taint_rules: dict[str, Mapping[str, Any]] = {}
        self.claims: dict[Key, Mapping[str, Any]] = {}
        self.templates: dict[Key, Mapping[str, Any]] = {}
        self.pods: dict[str, PodRecord] = {}
        self.workloads: dict[Key, Mapping[str, Any]] = {}
        self.checks: dict[str, Mapping[str, Any]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._synced: dict[str, threading.Event] = {}
        self.gpus: list[PublishedGpu] = []
        self.usage: dict[GpuKey, tuple[int, int]] = {}

    # -- derived views ---------------------------------------------------------------------

    def our_checks(self) -> set[str]:
        """Names of the AdmissionChecks whose controllerName is ours."""
        with self.lock:
            return {
                name
                for name, check in self.checks.items()
                if (check.get("spec") or {}).get("controllerName") == self.controller_name
            }

    def synced(self) -> bool:
        return bool(self._synced) and all(e.is_set() for e in self._synced.values())

    def wait_synced(self, timeout: float) -> bool:
        return all(event.wait(timeout) for event in self._synced.values())

    # -- handlers ----------------------------------------------------------------------------

    def _replace_or_update(
        self,
        store: dict[Any, Any],
        key_of: Callable[[Mapping[str, Any]], Any],
        kind: str,
        obj: Mapping[str, Any],
    ) -> None:
        if kind == "SYNCED":
            store.clear()
            for item in obj["items"]:
                store[key_of(item)] = item
        elif kind == "DELETED":
            store.pop(key_of(obj), None)
        else:
            store[key_of(obj)] = obj

    def _on_slices(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            self._replace_or_update(self.slices, lambda o: o["metadata"]["name"], kind, obj)
            self.gpus = gpus_from_slices(self.slices.values(), self.taint_rules.values())
        self._changed("slices", kind)

    def _on_taint_rules(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            self._replace_or_update(self.taint_rules, lambda o: o["metadata"]["name"], kind, obj)
            self.gpus = gpus_from_slices(self.slices.values(), self.taint_rules.values())
        self._changed("devicetaintrules", kind)

    def _on_claims(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            before = None if kind == "SYNCED" else self.claims.get(_key(obj))
            self._replace_or_update(self.claims, _key, kind, obj)
            self.usage = allocated_usage(self.claims.values()) if kind == "SYNCED" else self.usage
            if kind != "SYNCED":
                self._adjust_usage(before, -1)
                if kind != "DELETED":
                    self._adjust_usage(obj, +1)
        if kind == "SYNCED" or _claim_allocated(before) != _claim_allocated(obj) or kind == "DELETED":
            self._changed("claims", kind)

    def _adjust_usage(self, claim: Mapping[str, Any] | None, sign: int) -> None:
        if not claim:
            return
        for key, (memory, cores) in allocated_usage([claim]).items():
            m, c = self.usage.get(key, (0, 0))
            self.usage[key] = (m + sign * memory, c + sign * cores)

    def _on_templates(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            self._replace_or_update(self.templates, _key, kind, obj)
        self._changed("templates", kind)

    def _on_pods(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            if kind == "SYNCED":
                self.pods = {p["metadata"]["uid"]: pod_record(p) for p in obj["items"]}
                changed = True
            elif kind == "DELETED":
                changed = self.pods.pop(obj["metadata"]["uid"], None) is not None
            else:
                record = pod_record(obj)
                changed = self.pods.get(record.uid) != record
                self.pods[record.uid] = record
        if changed:
            self._changed("pods", kind)

    def _on_workloads(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            self._replace_or_update(self.workloads, _key, kind, obj)
        self._changed("workloads", kind)

    def _on_checks(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            self._replace_or_update(self.checks, lambda o: o["metadata"]["name"], kind, obj)
        self._changed("admissionchecks", kind)

    def _changed(self, what: str, kind: str) -> None:
        if kind == "SYNCED":
            self._synced[what].set()
        self._on_change(what)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        custom = functools.partial
        watches: list[
            tuple[str, Callable[..., Any], Callable[[str, Mapping[str, Any]], None], dict[str, str]]
        ] = [
            (
                "slices",
                self._resource.list_resource_slice,
                self._on_slices,
                {"field_selector": f"spec.driver={DRIVER_NAME}"},
            ),
            ("devicetaintrules", self._resource.list_device_taint_rule, self._on_taint_rules, {}),
            ("claims", self._resource.list_resource_claim_for_all_namespaces, self._on_claims, {}),
            (
                "templates",
                self._resource.list_resource_claim_template_for_all_namespaces,
                self._on_templates,
                {},
            ),
            ("pods", self._core.list_pod_for_all_namespaces, self._on_pods, {}),
            (
                "workloads",
                custom(self._custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, "workloads"),
                self._on_workloads,
                {},
            ),
            (
                "admissionchecks",
                custom(
                    self._custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, "admissionchecks"
                ),
                self._on_checks,
                {},
            ),
        ]
        for what, *_ in watches:
            self._synced[what] = threading.Event()
        for what, list_call, handler, selectors in watches:
            thread = threading.Thread(
                target=watch_forever,
                args=(list_call, handler, self._stop, what),
                kwargs=selectors,
                name=f"watch-{what}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop the watches. A watch thread notices within its server-side timeout; the threads are
        daemons, so a process that is exiting does not wait for them."""
        self._stop.set()


def _key(obj: Mapping[str, Any]) -> Key:
    metadata = obj["metadata"]
    return (metadata.get("namespace", ""), metadata["name"])
