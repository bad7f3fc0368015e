"""For each Workload waiting on our check: read its PodSets, ask ``fit``, and set Ready, or leave it
Pending with a message that says why, or Rejected when its GPU request is invalid.

Reading a PodSet never parses CEL:

- a pod template that still names ``nvidia.com/gpu``/``gpumem``/``gpumem-percentage``/``gpucores``
  (a Job's template: the webhook converts its pods only when the Job creates them) is read with the
  core's ``container_requests`` and ``selection_for``, the very code the webhook converts pods with;
- a pod template that references a ResourceClaimTemplate the webhook wrote (a plain pod, converted
  at creation) is read from the request the webhook recorded in the template's annotation
  ``gpu.tessera.dev/gpu-request``, once its spec is seen to ask the same counts, memory and cores (a
  template written by hand to look like the webhook's must not pass a small record off for a big
  request);
- a pod template that references a ResourceClaimTemplate a user wrote is read from its structure:
  requests of our DeviceClass, ``exactly`` or ``firstAvailable``, sized by their capacity. Its CEL
  selectors cannot be judged here; the share is sized as if any GPU matched, and the Ready message
  names the selectors not judged.

What is free is the published capacity less allocated claims less the shares of Workloads already
Ready on this check but not yet placed (their pods not bound). Those reserved shares are kept as a
plan: a new Workload is first fitted on what the plan leaves (fast), and only when that fails and
the free totals could hold it is everything repacked together (a reshuffle of the plan may make
room).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.admissioncheck.checks import sync_active
from tessera.admissioncheck.fit import (
    DEFAULT_BUDGET,
    Choice,
    Free,
    Gpu,
    Placement,
    PodGroup,
    Request,
    SummaryCache,
    apply,
    forget,
    free_capacity,
    no_fit_message,
    pack,
)
from tessera.admissioncheck.inventory import KUEUE_GROUP, KUEUE_VERSION, Inventory, Key
from tessera.gpu_request import (
    AnnotationError,
    GpuRequest,
    RecordError,
    Refusal,
    container_requests,
    request_from_annotation,
    selection_for,
    share_of,
)
from tessera.names import CORES_CAPACITY, DEVICE_CLASS, GPU_REQUEST_ANNOTATION, MEMORY_CAPACITY
from tessera.quantity import quantity_to_int

log = logging.getLogger(__name__)

READY, PENDING, REJECTED = "Ready", "Pending", "Rejected"


class Undecidable(Exception):
    """The PodSet cannot be read yet (a ResourceClaimTemplate not seen yet); decide again later."""


def request_of(gpu: GpuRequest) -> Request:
    """A GPU request as the packing sees it: one choice for an absolute memory or a percentage not
    converted yet (any GPU size), one per GPU memory size of a converted percentage (its claim's
    ``firstAvailable`` list, in the same order)."""
    cores = gpu.cores or 0
    if gpu.memory is not None:
        return Request(gpu.count, (Choice(memory=gpu.memory, cores=cores, selection=gpu.selection),))
    percent = gpu.memory_percent or 0
    if not gpu.memory_sizes:
        return Request(gpu.count, (Choice(memory_percent=percent, cores=cores, selection=gpu.selection),))
    choices = tuple(
        Choice(memory=share_of(size, percent), cores=cores, selection=gpu.selection, memory_size=size)
        for size in gpu.memory_sizes
    )
    return Request(gpu.count, choices)


def _choice_from_body(body: Mapping[str, Any], unknown: list[str]) -> Choice | None:
    """A claim request body (exactly or one subrequest) of our class as a Choice by its capacity;
    None if another class's. Its CEL selectors go to ``unknown``."""
    if body.get("deviceClassName") != DEVICE_CLASS:
        return None
    capacity = (body.get("capacity") or {}).get("requests") or {}
    unknown.extend((s.get("cel") or {}).get("expression", "") for s in body.get("selectors") or [])
    return Choice(
        memory=quantity_to_int(capacity.get(MEMORY_CAPACITY, 0)),
        cores=quantity_to_int(capacity.get(CORES_CAPACITY, 0)),
    )


def requests_from_claim_spec(spec: Mapping[str, Any], unknown: list[str]) -> list[Request]:
    """Our-class requests of a ResourceClaimSpec, by their structure (see the module docstring)."""
    out = []
    for request in (spec.get("devices") or {}).get("requests") or []:
        if request.get("exactly"):
            body = request["exactly"]
            choice = _choice_from_body(body, unknown)
            if choice is not None:
                out.append(Request(int(body.get("count") or 1), (choice,)))
        elif request.get("firstAvailable"):
            choices = []
            counts = set()
            for sub in request["firstAvailable"]:
                choice = _choice_from_body(sub, unknown)
                if choice is not None:
                    choices.append(choice)
                    counts.add(int(sub.get("count") or 1))
            if choices:
                out.append(Request(max(counts), tuple(choices)))
    return out


def _sizes(requests: list[Request]) -> list[tuple[int, tuple[tuple[int | None, int], ...]]]:
    return [(r.count, tuple((c.memory, c.cores) for c in r.choices)) for r in requests]


def requests_from_claim_template(
    where: str, template: Mapping[str, Any], unknown: list[str]
) -> list[Request]:
    """The requests of a ResourceClaimTemplate: the webhook's recorded request when it carries one,
    else its structure. Raises RecordError for a record that cannot be read or that its spec
    contradicts."""
    spec = template.get("spec") or {}
    annotations = (spec.get("metadata") or {}).get("annotations") or {}
    if GPU_REQUEST_ANNOTATION not in annotations:
        return requests_from_claim_spec(spec.get("spec") or {}, unknown)
    value = annotations[GPU_REQUEST_ANNOTATION]
    if not isinstance(value, str):
        raise RecordError(
            f"annotation {GPU_REQUEST_ANNOTATION} of ResourceClaimTemplate {where} is not text."
        )
    recorded = request_of(request_from_annotation(value))
    if _sizes(requests_from_claim_spec(spec.get("spec") or {}, [])) != _sizes([recorded]):
        raise RecordError(
            f"ResourceClaimTemplate {where} asks for other GPU shares than its annotation "
            f"{GPU_REQUEST_ANNOTATION} records."
        )
    return [recorded]


def requests_from_template(
    template: Mapping[str, Any],
    claim_templates: Mapping[Key, Mapping[str, Any]],
    namespace: str,
    unknown: list[str],
) -> list[Request]:
    """Every GPU request one pod of this PodSet template makes; raises Refusal/AnnotationError for a
    request the webhook would deny, RecordError for a webhook record that cannot be trusted,
    Undecidable when a referenced template is not known yet."""
    metadata = template.get("metadata") or {}
    spec = template.get("spec") or {}
    out: list[Request] = []
    asked = [gpu for *_, gpu in container_requests(spec)]
    if asked:  # the pod's annotations matter only when it asks for a GPU, as in the webhook
        selection = selection_for(metadata.get("annotations") or {})
        out.extend(request_of(replace(gpu, selection=selection)) for gpu in asked)
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("resourceClaimTemplateName")
        if not name:
            continue  # a claim made by someone else: it is allocated (and counted) on its own
        claim_template = claim_templates.get((namespace, name))
        if claim_template is None:
            raise Undecidable(f"ResourceClaimTemplate {namespace}/{name} is not known yet")
        out.extend(requests_from_claim_template(f"{namespace}/{name}", claim_template, unknown))
    return out


def pod_groups(
    workload: Mapping[str, Any], claim_templates: Mapping[Key, Mapping[str, Any]], unknown: list[str]
) -> list[PodGroup]:
    """The Workload's PodSets as PodGroups, counted as admitted (partial admission may admit fewer)."""
    namespace = workload["metadata"].get("namespace", "")
    admitted = {
        a.get("name"): a.get("count")
        for a in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    }
    groups = []
    for podset in (workload.get("spec") or {}).get("podSets") or []:
        name = podset.get("name", "main")
        count = admitted.get(name)
        if count is None:
            count = podset.get("count", 1)
        requests = requests_from_template(podset.get("template") or {}, claim_templates, namespace, unknown)
        groups.append(PodGroup(name, int(count), tuple(requests)))
    return groups


# -- Workload status (pure) ------------------------------------------------------------------------


def condition(workload: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def check_state(workload: Mapping[str, Any], check: str) -> Mapping[str, Any] | None:
    states: list[Mapping[str, Any]] = (workload.get("status") or {}).get("admissionChecks") or []
    return next((state for state in states if state.get("name") == check), None)


def live(workload: Mapping[str, Any]) -> bool:
    return condition(workload, "QuotaReserved") and not condition(workload, "Finished")


def priority_order(workload: Mapping[str, Any]) -> tuple[int, str, str]:
    """Higher priority first, then older first (as Kueue orders its queues)."""
    spec = workload.get("spec") or {}
    metadata = workload.get("metadata") or {}
    return (-int(spec.get("priority") or 0), metadata.get("creationTimestamp", ""), metadata.get("name", ""))


# -- the controller --------------------------------------------------------------------------------


@dataclass
class Decision:
    state: str
    message: str
    placements: list[Placement] = field(default_factory=list)
    groups: list[PodGroup] = field(default_factory=list)


@dataclass
class PassState:
    """One decision pass: the GPUs, what is free once allocated claims and the planned places of
    reserved shares are taken (less each Ready decision's placements as the pass goes), and the
    reserved Workloads whose shares found no place (while there are any, nothing more is let in)."""

    gpus: list[Gpu]
    free: Free
    unplanned: list[str]
    summaries: SummaryCache = field(default_factory=dict)

    def take(self, placements: Sequence[Placement]) -> None:
        self.free = apply(self.free, placements)
        forget(self.summaries, {p.node for p in placements})

    def give_back(self, placements: Sequence[Placement]) -> None:
        self.free = _give_back(self.free, placements)
        forget(self.summaries, {p.node for p in placements})


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
        self.stats = Stats()
        # Ready decisions not yet seen back through the watch: uid -> (name, groups to place).
        self._approved: dict[str, tuple[str, list[PodGroup]]] = {}
        # Where the reserved shares of each Ready Workload are planned to go.
        self._plans: dict[str, list[Placement]] = {}
        # What each waiting Workload was last told, so an unchanged message is not written again.
        self._told: dict[str, tuple[str, str]] = {}
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
            except (Refusal, AnnotationError, ValueError) as error:
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

    def _reserved_groups(
        self, checks: set[str], workloads: Sequence[Mapping[str, Any]]
    ) -> dict[str, tuple[str, list[PodGroup]]]:
        """Per Workload uid: its name and the shares of its pods not placed yet, for every Workload
        Ready on our check (and those this process just made Ready)."""
        inventory = self.inventory
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
            placed = [p for p in pods.values() if p.placed]
            try:
                groups = self._groups(workload, [])
            except (Refusal, AnnotationError, Undecidable, ValueError):
                continue
            name = f"{workload['metadata'].get('namespace')}/{workload['metadata']['name']}"
            out[uid] = (name, _less_placed(groups, placed))
        for uid, (name, groups) in self._approved.items():
            out.setdefault(uid, (name, groups))
        return out

    def _replan(
        self, gpus: list[Gpu], base: Free, reserved: Mapping[str, tuple[str, list[PodGroup]]]
    ) -> PassState:
        """Keep each reserved Workload's planned places that still fit (in the order planned),
        place the rest on what is left, and drop plans of Workloads no longer reserved."""
        free = dict(base)
        plans: dict[str, list[Placement]] = {}
        displaced: list[tuple[str, list[PodGroup]]] = []
        for uid, (_, groups) in reserved.items():
            wanted = {g.name: g.count for g in groups}
            kept: list[Placement] = []
            for placement in self._plans.get(uid, []):
                if wanted.get(placement.group, 0) > 0 and _room(free, placement):
                    free = apply(free, [placement])
                    kept.append(placement)
                    wanted[placement.group] -= 1
            plans[uid] = kept
            missing = [
                PodGroup(g.name, wanted[g.name], g.requests) for g in groups if wanted.get(g.name, 0) > 0
            ]
            if missing:
                displaced.append((uid, missing))
        unplanned = []
        for uid, missing in displaced:
            packed = pack(missing, gpus, free, self.budget)
            if packed.placements is None:
                unplanned.append(reserved[uid][0])
                continue
            free = apply(free, packed.placements)
            plans[uid].extend(packed.placements)
        self._plans = plans
        return PassState(gpus, free, unplanned)

    def decide(self, workload: Mapping[str, Any], state: PassState) -> Decision:
        """The decision for one waiting Workload, given this pass's free capacity."""
        unknown: list[str] = []
        try:
            groups = self._groups(workload, unknown)
        except (Refusal, AnnotationError) as error:
            return Decision(REJECTED, f"its GPU request can never be met: {error}")
        except Undecidable as error:
            return Decision(PENDING, f"waiting: {error}")
        except ValueError as error:
            return Decision(REJECTED, f"its GPU request cannot be read: {error}")
        if not any(g.shares_per_pod for g in groups):
            return Decision(READY, "asks for no GPU", groups=groups)
        if state.unplanned:
            names = ", ".join(sorted(state.unplanned)[:3])
            return Decision(
                PENDING,
                f"waiting: GPU shares of Workloads already admitted ({names}) no longer fit on the free "
                "GPUs; nothing more is admitted until they are placed or capacity returns",
            )
        note = f" (selectors not judged here: {'; '.join(unknown)})" if unknown else ""
        fitted = pack(groups, state.gpus, state.free, self.budget, state.summaries)
        if fitted.placements is not None:
            return Decision(READY, f"fits: {_where(fitted.placements)}{note}", fitted.placements, groups)
        return Decision(PENDING, no_fit_message(groups, state.gpus, state.free, fitted.exhausted) + note)

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
            for uid in [u for u in self._approved if u not in live_uids]:
                del self._approved[uid]
            reserved = self._reserved_groups(checks, workloads)
            waiting = [
                (w, c)
                for w in workloads
                for c in checks
                if live(w)
                and (check_state(w, c) or {}).get("state") == PENDING
                and w["metadata"].get("uid", "") not in self._approved
            ]
        planning = time.perf_counter()
        state = self._replan(gpus, base, reserved)
        self.stats.pass_durations.append(time.perf_counter() - planning)
        del self.stats.pass_durations[:-10000]
        if state.unplanned:
            log.warning(
                "GPU shares of admitted Workloads %s no longer fit on the free GPUs; holding the rest",
                ", ".join(state.unplanned),
            )
        waiting.sort(key=lambda wc: priority_order(wc[0]))
        decided = 0
        for workload, check in waiting:
            if self._stop.is_set():
                break
            started = time.perf_counter()
            decision = self.decide(workload, state)
            self.stats.record(decision.state, time.perf_counter() - started)
            decided += 1
            name = f"{workload['metadata'].get('namespace')}/{workload['metadata']['name']}"
            uid = workload["metadata"].get("uid", "")
            told = (decision.state, decision.message)
            if self._told.get(uid) != told:
                log.info("workload %s: %s on %s: %s", name, decision.state, check, decision.message)
            if decision.state == READY:
                self._approved[uid] = (name, decision.groups)
                self._plans[uid] = decision.placements
                state.take(decision.placements)
            if not self._write(workload, check, decision):
                if self._approved.pop(uid, None) is not None:
                    del self._plans[uid]
                    state.give_back(decision.placements)
                continue
            self._told[uid] = told
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
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {
                "name": workload["metadata"]["name"],
                "namespace": workload["metadata"]["namespace"],
            },
            "status": {
                "admissionChecks": [
                    {
                        "name": check,
                        "state": decision.state,
                        "message": decision.message[:8000],
                        "lastTransitionTime": transition,
                    }
                ]
            },
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
            self._wake.wait()
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


def _less_placed(groups: list[PodGroup], placed: Sequence[Any]) -> list[PodGroup]:
    """The groups less the pods already placed: by role hash when pods carry one (pod groups),
    otherwise from the first group on (a Job has one PodSet)."""
    remaining = {g.name: g.count for g in groups}
    for pod in placed:
        name = (
            pod.role_hash
            if pod.role_hash in remaining
            else next((n for n, c in remaining.items() if c > 0), None)
        )
        if name is not None and remaining[name] > 0:
            remaining[name] -= 1
    return [PodGroup(g.name, remaining[g.name], g.requests) for g in groups if remaining[g.name] > 0]


def _room(free: Free, placement: Placement) -> bool:
    """Whether every share of ``placement`` still has room where it was planned."""
    need: dict[Any, tuple[int, int]] = {}
    for key, memory, cores in placement.shares:
        m, c = need.get(key, (0, 0))
        need[key] = (m + memory, c + cores)
    return all(key in free and free[key][0] >= m and free[key][1] >= c for key, (m, c) in need.items())


def _give_back(free: Free, placements: Sequence[Placement]) -> Free:
    out = dict(free)
    for placement in placements:
        for key, memory, cores in placement.shares:
            m, c = out[key]
            out[key] = (m + memory, c + cores)
    return out


def _where(placements: Sequence[Placement]) -> str:
    nodes: dict[str, int] = {}
    for placement in placements:
        if placement.node:
            nodes[placement.node] = nodes.get(placement.node, 0) + 1
    return (
        ", ".join(f"{n} pod{'s' if n != 1 else ''} on {node}" for node, n in sorted(nodes.items()))
        or "no GPU"
    )
