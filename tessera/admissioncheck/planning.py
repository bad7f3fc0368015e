"""One decision pass, pure: where the shares of the Workloads already Ready (not yet placed) are
planned to go, and, on what that leaves free, whether a waiting Workload's shares fit.

What is free is the published capacity less allocated claims less the shares of Workloads already
Ready on our check but not yet placed (their pods not bound). Those reserved shares are kept as a
plan from pass to pass: each keeps its planned place while that still has room, and only the
displaced ones are packed again, so a pass costs little when nothing moved. While a reserved share
has no place at all, nothing more is let in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.admissioncheck.fit import (
    Free,
    Placement,
    PodGroup,
    SummaryCache,
    apply,
    first_fit,
    forget,
    no_fit_message,
    pack,
)
from tessera.admissioncheck.podsets import Undecidable
from tessera.admissioncheck.workload_status import PENDING, READY, REJECTED
from tessera.gpu_request import AnnotationError, Refusal
from tessera.slices import PublishedGpu

Reserved = Mapping[str, tuple[str, list[PodGroup]]]
"""Per Workload uid: its name and the shares of its pods not placed yet."""


@dataclass
class Decision:
    state: str
    message: str
    placements: list[Placement] = field(default_factory=list)
    groups: list[PodGroup] = field(default_factory=list)
    holdable: bool = False
    """Whether each PodSet may be held to its planned node: placed whole on it by the scheduler's
    own rule (fit.Packing.whole_groups)."""
    pins: dict[str, str] = field(default_factory=dict)
    """PodSet -> the node its pods are held to (:mod:`pinning`), for a Ready decision."""


@dataclass
class PassState:
    """One decision pass: the GPUs, what is free once allocated claims and the planned places of
    reserved shares are taken (less each Ready decision's placements as the pass goes), and the
    reserved Workloads whose shares found no place (while there are any, nothing more is let in)."""

    gpus: list[PublishedGpu]
    free: Free
    unplanned: list[str]
    summaries: SummaryCache = field(default_factory=dict)
    awaited: set[str] = field(default_factory=set)
    """Nodes where pods already admitted are yet to arrive (see :func:`replan`)."""

    def take(self, decision: Decision) -> None:
        placements = decision.placements
        self.awaited |= awaited_by(placements, self.gpus, decision.holdable)
        self.free = apply(self.free, placements)
        forget(self.summaries, {p.node for p in placements})

    def give_back(self, placements: Sequence[Placement]) -> None:
        self.free = give_back(self.free, placements)
        forget(self.summaries, {p.node for p in placements})


def replan(
    plans: Mapping[str, list[Placement]],
    gpus: list[PublishedGpu],
    base: Free,
    reserved: Reserved,
    budget: int,
    pins: Mapping[str, Mapping[str, str]] | None = None,
    arriving: Collection[str] = (),
) -> tuple[PassState, dict[str, list[Placement]]]:
    """Keep each reserved Workload's planned places that still fit (in the order planned), place
    the rest on what is left, and drop plans of Workloads no longer reserved: the pass's state and
    the new plans. A PodSet held to a node (``pins``: per Workload uid, PodSet -> node) is planned
    anew on every pass, on that node only, as the scheduler will place it (:func:`fit.first_fit`,
    Workloads in the order given); when it no longer fits there, its Workload is unplanned. The
    nodes that ``arriving`` Workloads (uids whose pods are yet to be placed and may be arriving
    now) are planned on are the state's ``awaited``: a plan there is the scheduler's only if the
    pods arrive in the order planned, so no other Workload is planned there meanwhile."""
    free = dict(base)
    out: dict[str, list[Placement]] = {}
    displaced: list[tuple[str, list[PodGroup]]] = []
    unplanned = []
    awaited: set[str] = set()
    by_node: dict[str, list[PublishedGpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    for uid, (name, groups) in reserved.items():
        held = (pins or {}).get(uid, {})
        held_placed = _first_fit_held([g for g in groups if g.name in held], held, by_node, free)
        if held_placed is None:
            unplanned.append(name)
            held_placed = []
        free = apply(free, held_placed)
        wanted = {g.name: g.count for g in groups if g.name not in held}
        kept: list[Placement] = list(held_placed)
        for placement in plans.get(uid, []):
            if wanted.get(placement.group, 0) > 0 and has_room(free, placement):
                free = apply(free, [placement])
                kept.append(placement)
                wanted[placement.group] -= 1
        out[uid] = kept
        missing = [PodGroup(g.name, wanted[g.name], g.requests) for g in groups if wanted.get(g.name, 0) > 0]
        if missing:
            displaced.append((uid, missing))
    for uid, missing in displaced:
        packed = pack(missing, gpus, free, budget)
        if packed.placements is None:
            if reserved[uid][0] not in unplanned:
                unplanned.append(reserved[uid][0])
            continue
        free = apply(free, packed.placements)
        out[uid].extend(packed.placements)
    for uid in arriving:
        awaited |= awaited_by(out.get(uid, []), gpus, bool((pins or {}).get(uid)))
    return PassState(gpus, free, unplanned, awaited=awaited), out


def spread(placements: Sequence[Placement]) -> bool:
    """Whether some PodSet's pods are planned on more than one node (so it cannot be held)."""
    nodes: dict[str, set[str]] = {}
    for placement in placements:
        if placement.node:
            nodes.setdefault(placement.group, set()).add(placement.node)
    return any(len(found) > 1 for found in nodes.values())


def awaited_by(placements: Sequence[Placement], gpus: Sequence[PublishedGpu], held: bool) -> set[str]:
    """The nodes where these arriving pods could land: their planned nodes when they are held
    there, every node otherwise (nothing holds the pods to the plan)."""
    if held and not spread(placements):
        return {p.node for p in placements if p.node}
    if not any(p.node for p in placements):
        return set()
    return {gpu.node for gpu in gpus}


def _first_fit_held(
    groups: Sequence[PodGroup], held: Mapping[str, str], by_node: Mapping[str, list[PublishedGpu]], free: Free
) -> list[Placement] | None:
    """The held groups' pods placed on their nodes as the scheduler will place them, or None when
    one of them no longer fits on its node."""
    placed: list[Placement] = []
    for group in groups:
        found = first_fit(group, by_node.get(held[group.name], []), free)
        if found is None:
            return None
        free = apply(free, found)
        placed.extend(found)
    return placed


def unreadable(error: Exception) -> Decision:
    """The decision for a Workload whose PodSets could not be read: rejected with the reason when
    no GPU could ever meet them or they cannot be read, pending while a template is not known yet."""
    if isinstance(error, Refusal | AnnotationError):
        return Decision(REJECTED, f"its GPU request can never be met: {error}")
    if isinstance(error, Undecidable):
        return Decision(PENDING, f"waiting: {error}")
    return Decision(REJECTED, f"its GPU request cannot be read: {error}")


def decide(groups: list[PodGroup], unknown: Sequence[str], state: PassState, budget: int) -> Decision:
    """The decision for one waiting Workload's ``groups``, given this pass's free capacity;
    ``unknown`` are the selectors it names that are not judged here, which a Ready message names."""
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
    fitted = pack(groups, state.gpus, state.free, budget, state.summaries, frozenset(state.awaited))
    holdable = fitted.whole_groups
    if fitted.placements is not None and not (
        state.awaited & awaited_by(fitted.placements, state.gpus, holdable)
    ):
        message = f"fits: {where(fitted.placements)}{note}"
        return Decision(READY, message, fitted.placements, groups, holdable=holdable)
    if fitted.placements is not None:
        # Not holdable (spread across nodes, or packed tighter than the scheduler's first fit):
        # wait for a quiet moment, and let nothing else in meanwhile (it would keep the moment away).
        state.awaited |= {gpu.node for gpu in state.gpus}
        return Decision(
            PENDING,
            f"waiting: fits ({where(fitted.placements)}) once the pods already admitted onto those "
            "nodes are placed; nothing else is admitted meanwhile",
        )
    if fitted.waits_for is not None:
        return Decision(
            PENDING,
            f"waiting: fits on {fitted.waits_for} once the pods already admitted there are placed "
            "(placed in another order than planned, they could leave no room)",
        )
    return Decision(PENDING, no_fit_message(groups, state.gpus, state.free, fitted.exhausted) + note)


def less_reclaimable(groups: list[PodGroup], workload: Mapping[str, Any]) -> list[PodGroup]:
    """The groups less the pods Kueue counts as no longer needed (``status.reclaimablePods``: for a
    Job, the pods that succeeded once fewer completions remain than its parallelism). Finished pods
    are not counted as placed, so this is what keeps a succeeded pod's shares from being reserved
    again, while a failed pod's replacement still gets a reservation."""
    reclaimable: dict[str, int] = {}
    for entry in (workload.get("status") or {}).get("reclaimablePods") or []:
        try:
            reclaimable[str(entry.get("name"))] = max(0, int(entry.get("count") or 0))
        except (TypeError, ValueError):
            continue
    return [
        PodGroup(g.name, max(0, g.count - reclaimable.get(g.name, 0)), g.requests)
        for g in groups
        if g.count - reclaimable.get(g.name, 0) > 0
    ]


def less_placed(groups: list[PodGroup], placed: Sequence[Any]) -> list[PodGroup]:
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


def has_room(free: Free, placement: Placement) -> bool:
    """Whether every share of ``placement`` still has room where it was planned."""
    need: dict[Any, tuple[int, int]] = {}
    for key, memory, cores in placement.shares:
        m, c = need.get(key, (0, 0))
        need[key] = (m + memory, c + cores)
    return all(key in free and free[key][0] >= m and free[key][1] >= c for key, (m, c) in need.items())


def give_back(free: Free, placements: Sequence[Placement]) -> Free:
    """``free`` plus what ``placements`` took (the inverse of :func:`fit.apply`)."""
    out = dict(free)
    for placement in placements:
        for key, memory, cores in placement.shares:
            m, c = out[key]
            out[key] = (m + memory, c + cores)
    return out


def where(placements: Sequence[Placement]) -> str:
    """'2 pods on node-a, 1 pod on node-b': where a Ready Workload's pods are planned to go."""
    nodes: dict[str, int] = {}
    for placement in placements:
        if placement.node:
            nodes[placement.node] = nodes.get(placement.node, 0) + 1
    return (
        ", ".join(f"{n} pod{'s' if n != 1 else ''} on {node}" for node, n in sorted(nodes.items()))
        or "no GPU"
    )
