"""The admission check's controller: whenever a watch says something changed, one decision pass
(:mod:`planning`) over every Workload waiting on our checks, highest priority first, and the result
written as our check's state on each (server-side apply of our one entry of
``status.admissionChecks``): Ready, Pending with a message that says why, or Rejected when its GPU
request is invalid. A Ready state holds each PodSet planned on one node to that node
(:mod:`pinning`), and while an admitted Workload's pods arrive no other is planned onto its nodes
(:func:`planning.replan`), so that the scheduler places the pods as planned.

What it keeps between passes: the PodSets it read per Workload version (:mod:`podsets`), the
Ready decisions the watch has not echoed back yet, the plan of where reserved shares go, and what
each Workload was last told (an unchanged message is not written again).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.admissioncheck.checks import sync_active
from tessera.admissioncheck.fit import DEFAULT_BUDGET, Placement, PodGroup, free_capacity
from tessera.admissioncheck.inventory import KUEUE_GROUP, KUEUE_VERSION, Inventory, is_placed
from tessera.admissioncheck.pinning import HostnameLabels, pins_for, pins_from_state, pod_set_updates
from tessera.admissioncheck.planning import (
    Decision,
    PassState,
    Reserved,
    decide,
    less_placed,
    less_reclaimable,
    replan,
    unreadable,
)
from tessera.admissioncheck.podsets import Undecidable, pod_groups
from tessera.admissioncheck.workload_status import (
    PENDING,
    READY,
    check_state,
    condition,
    live,
    priority_order,
)

log = logging.getLogger(__name__)

ARRIVAL_WINDOW_SECONDS = 30.0
"""How long a Ready Workload's unplaced pods count as arriving, from its Ready decision (or from
when this process first saw it Ready, after a restart): Kueue admits it, its owner (a Job) makes the
pods, the scheduler places them, which on a busy control plane takes seconds. While a Workload's
pods arrive, no other Workload is planned onto its nodes (planning.replan). Past the window the
node is planned on again, whether or not they came: a pod the scheduler cannot place for a reason of
its own (a taint, a claim released late) must not hold a node's admissions for ever. The decision
loop wakes when the earliest window ends, so a Workload told to wait for it is decided again then."""

WRITERS = 8
"""Status writes in flight at once. Decisions are taken one after another (each takes capacity the
next must not see), but their writes are independent: one at a time, a pass over a burst of
Workloads waited for the API server's round trip once per Workload (benchmarks/admissioncheck)."""


def holding_news(before: frozenset[str], now: frozenset[str]) -> tuple[int, str] | None:
    """What to log about admitted Workloads whose shares found no place (``now``) when the last
    pass had ``before``: a warning when the set changes to a non-empty one, a line when it empties,
    nothing while it stays the same. Every pass would otherwise repeat it (hundreds of lines a
    minute while pods wait for room)."""
    if now and now != before:
        names = ", ".join(sorted(now))
        return (
            logging.WARNING,
            f"GPU shares of admitted Workloads {names} no longer fit on the free GPUs; holding the rest",
        )
    if before and not now:
        return logging.INFO, "the GPU shares of every admitted Workload fit again; deciding as usual"
    return None


@dataclass
class Stats:
    """Decision counts and the last decisions' durations, for logs, /metrics and the benchmark."""

    decisions: int = 0
    ready: int = 0
    pending: int = 0
    rejected: int = 0
    durations: list[float] = field(default_factory=list)
    pass_durations: list[float] = field(default_factory=list)
    """Time each pass spent planning the reserved shares before its first decision."""

    def record(self, state: str, seconds: float) -> None:
        self.decisions += 1
        setattr(self, state.lower(), getattr(self, state.lower()) + 1)
        self.durations.append(seconds)
        del self.durations[:-10000]


class WorkloadController:
    """Decides every waiting Workload whenever a watch says something changed."""

    def __init__(
        self, api: client.ApiClient, inventory: Inventory, field_manager: str, budget: int = DEFAULT_BUDGET
    ):
        self._custom = client.CustomObjectsApi(api)
        self.inventory = inventory
        self.field_manager = field_manager
        self.budget = budget
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="check-writes")
        self.stats = Stats()
        # Ready decisions not yet seen back through the watch: uid -> (name, groups to place).
        self._approved: dict[str, tuple[str, list[PodGroup]]] = {}
        # The nodes those Ready decisions hold PodSets to (echoed ones are read from the Workload).
        self._approved_pins: dict[str, dict[str, str]] = {}
        self._hostnames = HostnameLabels(api)
        # When this process decided each Workload Ready, or first saw it Ready (monotonic): the
        # start of its arrival window (ARRIVAL_WINDOW_SECONDS).
        self._ready_at: dict[str, float] = {}
        # When the earliest arrival window of this pass ends (time.monotonic()), if any: the loop
        # decides again then, whether or not a watch says something changed.
        self._window_ends: float | None = None
        # Where the reserved shares of each Ready Workload are planned to go.
        self._plans: dict[str, list[Placement]] = {}
        # What each waiting Workload was last told, so an unchanged message is not written again.
        self._told: dict[str, tuple[str, str]] = {}
        # Admitted Workloads whose shares had no place on the last pass (logged when this changes).
        self._unplanned: frozenset[str] = frozenset()
        # PodSets read once per Workload version (podSets are immutable; admission sets the counts).
        self._read: dict[str, tuple[object, list[PodGroup] | Exception, list[str]]] = {}

    def _groups(self, workload: Mapping[str, Any], unknown: list[str]) -> list[PodGroup]:
        """``pod_groups`` of the Workload, remembered until its generation or admitted counts
        change; a template not known yet is looked for again on every call."""
        metadata = workload["metadata"]
        admission = (workload.get("status") or {}).get("admission") or {}
        counts = tuple((a.get("name"), a.get("count")) for a in admission.get("podSetAssignments") or [])
        version = (metadata.get("generation"), counts)
        uid = metadata.get("uid", "")
        cached = self._read.get(uid)
        if cached is None or cached[0] != version:
            found: list[str] = []
            try:
                result: list[PodGroup] | Exception = pod_groups(workload, self.inventory.templates, found)
            except Undecidable:
                raise
            except ValueError as error:  # Refusal, AnnotationError and RecordError among them
                result = error
            cached = (version, result, found)
            self._read[uid] = cached
        unknown.extend(cached[2])
        if isinstance(cached[1], Exception):
            raise type(cached[1])(*cached[1].args)  # a fresh one: no traceback grows across passes
        return cached[1]

    def wake(self, what: str = "") -> None:
        self._wake.set()

    # -- one pass ----------------------------------------------------------------------------

    def _held(self, checks: set[str], workloads: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
        """Per Workload uid, the PodSets its Ready state holds to a node (:mod:`pinning`)."""
        out = {uid: dict(pins) for uid, pins in self._approved_pins.items()}
        for workload in workloads:
            for check in checks:
                state = check_state(workload, check)
                if (state or {}).get("state") == READY and (pins := pins_from_state(state)):
                    out[workload["metadata"].get("uid", "")] = pins
        return out

    def _reserved_groups(
        self, checks: set[str], workloads: Sequence[Mapping[str, Any]]
    ) -> tuple[Reserved, dict[str, float]]:
        """Per Workload uid: its name and the shares of its pods not placed yet, for every Workload
        Ready on our check (and those this process just made Ready); and, for those among them whose
        pods may be arriving now, when their arrival window ends (time.monotonic()): a Workload with
        an owner to make its pods and some not placed yet, made Ready (or first seen Ready) less
        than ARRIVAL_WINDOW_SECONDS ago. (A Workload without owner has no pods to wait for.)"""
        now = time.monotonic()
        inventory = self.inventory
        arriving: dict[str, float] = {}
        by_owner: dict[str, list[Any]] = {}
        for pod in inventory.pods.values():
            for owner in (*pod.owners, pod.uid):
                by_owner.setdefault(owner, []).append(pod)
        out: dict[str, tuple[str, list[PodGroup]]] = {}
        for workload in workloads:
            uid = workload["metadata"].get("uid", "")
            ready = any((check_state(workload, c) or {}).get("state") == READY for c in checks)
            if not (ready and live(workload) and not condition(workload, "Evicted")):
                continue
            owners = [o.get("uid", "") for o in workload["metadata"].get("ownerReferences") or []]
            pods = {p.uid: p for o in owners for p in by_owner.get(o, [])}
            placed = [p for p in pods.values() if is_placed(p, inventory.claims)]
            try:
                groups = self._groups(workload, [])
            except (Undecidable, ValueError):
                continue
            name = f"{workload['metadata'].get('namespace')}/{workload['metadata']['name']}"
            remaining = less_placed(less_reclaimable(groups, workload), placed)
            out[uid] = (name, remaining)
            if owners and remaining:
                ends = self._ready_at.setdefault(uid, now) + ARRIVAL_WINDOW_SECONDS
                if ends > now:
                    arriving[uid] = ends
        for uid, (name, groups) in self._approved.items():
            if uid not in out:
                out[uid] = (name, groups)
                arriving[uid] = self._ready_at.get(uid, now) + ARRIVAL_WINDOW_SECONDS
        return out, arriving

    def decide(self, workload: Mapping[str, Any], state: PassState) -> Decision:
        """The decision for one waiting Workload, given this pass's free capacity."""
        unknown: list[str] = []
        try:
            groups = self._groups(workload, unknown)
        except (Undecidable, ValueError) as error:
            return unreadable(error)
        return decide(groups, unknown, state, self.budget)

    def run_once(self) -> int:
        """Decide every waiting Workload once, highest priority first; returns how many were decided."""
        inventory = self.inventory
        with inventory.lock:
            known_checks = dict(inventory.checks)
        sync_active(self._custom, known_checks, inventory.controller_name, self.field_manager)
        checks = inventory.our_checks()
        if not checks:
            return 0
        with inventory.lock:
            workloads = list(inventory.workloads.values())
            gpus = list(inventory.gpus)
            base = free_capacity(gpus, inventory.usage)
            live_uids = {w["metadata"].get("uid", "") for w in workloads if live(w)}
            for workload in workloads:
                # Approvals the watch has echoed back are read from the Workloads themselves.
                if any((check_state(workload, c) or {}).get("state") == READY for c in checks):
                    self._approved.pop(workload["metadata"].get("uid", ""), None)
                    self._approved_pins.pop(workload["metadata"].get("uid", ""), None)
            for uid in [u for u in self._approved if u not in live_uids]:
                del self._approved[uid]
                self._approved_pins.pop(uid, None)
            for uid in [u for u in self._ready_at if u not in live_uids]:
                del self._ready_at[uid]
            reserved, arriving = self._reserved_groups(checks, workloads)
            # Held PodSets are planned anew each pass in this order: the order they were made Ready
            # in, which is the order their pods arrive in (those from before a restart first).
            reserved = dict(sorted(reserved.items(), key=lambda item: self._ready_at.get(item[0], 0.0)))
            held = self._held(checks, workloads)
            waiting = [
                (w, c)
                for w in workloads
                for c in checks
                if live(w)
                and (check_state(w, c) or {}).get("state") == PENDING
                and w["metadata"].get("uid", "") not in self._approved
            ]
        planning = time.perf_counter()
        self._window_ends = min(arriving.values(), default=None)
        state, self._plans = replan(self._plans, gpus, base, reserved, self.budget, held, arriving)
        self.stats.pass_durations.append(time.perf_counter() - planning)
        del self.stats.pass_durations[:-10000]
        unplanned = frozenset(state.unplanned)
        news = holding_news(self._unplanned, unplanned)
        if news:
            log.log(*news)
        self._unplanned = unplanned
        waiting.sort(key=lambda wc: priority_order(wc[0]))
        decided = 0
        writes: list[tuple[str, Decision, Future[bool]]] = []
        for workload, check in waiting:
            if self._stop.is_set():
                break
            started = time.perf_counter()
            decision = self.decide(workload, state)
            self.stats.record(decision.state, time.perf_counter() - started)
            decided += 1
            name = f"{workload['metadata'].get('namespace')}/{workload['metadata']['name']}"
            uid = workload["metadata"].get("uid", "")
            if self._told.get(uid) != (decision.state, decision.message):
                log.info("workload %s: %s on %s: %s", name, decision.state, check, decision.message)
            if decision.state == READY:
                if decision.holdable:
                    decision.pins = pins_for(workload, decision.placements, self._hostnames)
                self._approved[uid] = (name, decision.groups)
                self._approved_pins[uid] = decision.pins
                self._plans[uid] = decision.placements
                self._ready_at[uid] = time.monotonic()
                state.take(decision)
            writes.append((uid, decision, self._writers.submit(self._write, workload, check, decision)))
        for uid, decision, written in writes:
            if not written.result():
                if self._approved.pop(uid, None) is not None:
                    del self._plans[uid]
                    self._approved_pins.pop(uid, None)
                    state.give_back(decision.placements)
                continue
            self._told[uid] = (decision.state, decision.message)
        for uid in [u for u in self._told if u not in live_uids]:
            del self._told[uid]
        for uid in [u for u in self._read if u not in live_uids]:
            del self._read[uid]
        return decided

    def _write(self, workload: Mapping[str, Any], check: str, decision: Decision) -> bool:
        """Server-side apply of our one entry of status.admissionChecks."""
        current = check_state(workload, check) or {}
        if current.get("state") == decision.state and current.get("message") == decision.message:
            return True
        transition = current.get("lastTransitionTime")
        if current.get("state") != decision.state or not transition:
            transition = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entry: dict[str, Any] = {
            "name": check,
            "state": decision.state,
            "message": decision.message[:8000],
            "lastTransitionTime": transition,
        }
        if decision.pins:
            entry["podSetUpdates"] = pod_set_updates(decision.pins)
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {
                "name": workload["metadata"]["name"],
                "namespace": workload["metadata"]["namespace"],
            },
            "status": {"admissionChecks": [entry]},
        }
        try:
            self._custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                workload["metadata"]["namespace"],
                "workloads",
                workload["metadata"]["name"],
                body,
                field_manager=self.field_manager,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as error:
            if error.status == 404:
                return False
            log.warning(
                "writing %s on workload %s/%s failed: %s %s",
                decision.state,
                workload["metadata"]["namespace"],
                workload["metadata"]["name"],
                error.status,
                error.reason,
            )
            self._wake.set()  # try again on the next pass
            return False
        return True

    # -- loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            ends = self._window_ends
            self._wake.wait(None if ends is None else max(0.0, ends - time.monotonic()))
            if self._stop.is_set():
                return
            # Let a burst of watch events settle into one pass.
            self._stop.wait(0.02)
            self._wake.clear()
            try:
                self.run_once()
            except Exception:
                log.exception("decision pass failed; trying again on the next change")
                self._stop.wait(1.0)
                self._wake.set()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="decisions", daemon=True)
        self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._writers.shutdown(wait=True)
