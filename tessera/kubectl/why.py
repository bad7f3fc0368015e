"""Why a pod with Tessera claims waits: each GPU judged against what its claims ask; pure.

The pod's requests are read with the admission check's reader (podsets.requests_from_template:
the webhook's recorded request with its GPU selection, or a claim's structure), GPUs and free
capacity with the admission check's inventory readers, and the final word on whether the shares fit
together is the admission check's own packing (fit.pack), so this never says "fits" where the
admission check says "does not", nor the reverse. What is added here is the telling: one sentence
per reason, the most basic first (no GPU is of the kind asked; none has room; those with room are
cordoned; no node has enough of them), as an operator would check them.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.admissioncheck.fit import (
    Choice,
    PodGroup,
    Request,
    format_bytes,
    free_capacity,
    no_fit_message,
    pack,
)
from tessera.admissioncheck.inventory import Key, allocated_usage
from tessera.admissioncheck.podsets import Undecidable, requests_from_claim_spec, requests_from_template
from tessera.gpu_request import AnnotationError, RecordError, Refusal, Selection
from tessera.kubectl.snapshot import Snapshot
from tessera.kubectl.text import cut
from tessera.kubectl.views import all_gpus, cordoned_nodes, is_cordon
from tessera.slices import PublishedGpu

LISTED = 5
"""GPUs or values named in one sentence; the rest are counted."""

VALUE_LIMIT = 80
"""Characters of one value (a type, a UUID, a product) quoted in a sentence."""


@dataclass
class GpuJudgement:
    """One GPU against the pod's requests: its free capacity and, per request, what stops it
    taking that request's share ('' when nothing does)."""

    gpu: PublishedGpu
    free_memory: int
    free_cores: int
    problems: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """The pod's judgement: ``reasons`` are whole sentences; ``fits`` when its shares fit now."""

    fits: bool
    reasons: list[str]
    gpus: list[GpuJudgement] = field(default_factory=list)


def waiting_since(pod: Mapping[str, Any]) -> datetime.datetime | None:
    """When the scheduler last found the pod unschedulable (its PodScheduled condition), or None
    when it is placed or not found unschedulable."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            try:
                since = datetime.datetime.fromisoformat(str(condition.get("lastTransitionTime")))
            except ValueError:
                return None
            return since if since.tzinfo is not None else None  # no zone: no comparable time
    return None


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def _values(values: Sequence[str]) -> list[str]:
    """Values anyone can write (a product, a UUID, a selector) cut to fit in a sentence."""
    return [cut(value, VALUE_LIMIT) for value in values]


def _label(gpu: PublishedGpu) -> str:
    return f"{cut(gpu.uuid or gpu.name, VALUE_LIMIT)} on {gpu.node}"


def pod_requests(pod: Mapping[str, Any], snapshot: Snapshot) -> tuple[list[Request], list[str]]:
    """What the pod's GPU shares ask, read as the admission check reads a pod template, plus the
    claims it names directly that are not allocated yet; and the CEL selectors not judged here.
    Raises what the reader raises (Refusal, AnnotationError, RecordError, Undecidable)."""
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    templates: dict[Key, Mapping[str, Any]] = {
        (t["metadata"].get("namespace", ""), t["metadata"]["name"]): t for t in snapshot.templates
    }
    unknown: list[str] = []
    requests = requests_from_template(
        {"metadata": metadata, "spec": pod.get("spec") or {}}, templates, namespace, unknown
    )
    claims = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in snapshot.claims}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        claim = claims.get((namespace, entry.get("resourceClaimName") or ""))
        if claim is not None and not (claim.get("status") or {}).get("allocation"):
            requests.extend(requests_from_claim_spec(claim.get("spec") or {}, unknown))
    return requests, unknown


def _selection_sentence(choices: Sequence[Choice], gpus: Sequence[PublishedGpu]) -> str:
    """Why no GPU matches any of ``choices``: the selector nothing meets, with what there is."""
    products = _values(sorted({g.product for g in gpus if g.product}))
    uuids = _values(sorted({g.uuid for g in gpus if g.uuid}))
    if not gpus:
        return "this cluster publishes no Tessera GPU"
    selection = choices[0].selection
    if selection.use_types is not None and not any(
        Selection(use_types=selection.use_types).matches(g.uuid, g.product) for g in gpus
    ):
        asked = " or ".join(f"'{t}'" for t in _values(selection.use_types[:LISTED]))
        return f"no GPU's product contains {asked} (this cluster has: {_listed(products)})"
    if selection.use_uuids is not None and not any(
        Selection(use_uuids=selection.use_uuids).matches(g.uuid, g.product) for g in gpus
    ):
        asked = " or ".join(f"'{u}'" for u in _values(selection.use_uuids[:LISTED]))
        return f"no GPU has UUID {asked} (this cluster has: {_listed(uuids)})"
    sizes = sorted({c.memory_size for c in choices if c.memory_size is not None})
    if sizes and not any(g.memory in sizes for g in gpus):
        have = sorted({format_bytes(g.memory) for g in gpus})
        return (
            f"no GPU has the memory size its percentage was converted for "
            f"({_listed([format_bytes(s) for s in sizes])}; this cluster has: {_listed(have)})"
        )
    return "no GPU meets all of the pod's GPU selectors together (its type, UUID and exclusion annotations)"


def judge(pod: Mapping[str, Any], snapshot: Snapshot) -> Verdict:
    """The pod judged against the snapshot's GPUs; see the module docstring."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return Verdict(True, [f"it is placed on node {spec['nodeName']}; nothing keeps it waiting for a GPU"])
    try:
        requests, unknown = pod_requests(pod, snapshot)
    except (Refusal, AnnotationError, RecordError) as error:
        return Verdict(False, [f"its GPU request can never be met: {error}"])
    except Undecidable as error:
        return Verdict(False, [f"its GPU request cannot be read yet: {error}"])
    requests = [r for r in requests if r.count and r.choices]
    if not requests:
        return Verdict(True, ["it asks for no Tessera GPU share that is not already allocated"])
    gpus = all_gpus(snapshot)
    free = free_capacity(gpus, allocated_usage(snapshot.claims))
    node_cordons = cordoned_nodes(snapshot.nodes)
    judged = [GpuJudgement(g, *free[g.key]) for g in gpus]
    reasons: list[str] = []
    for request in requests:
        reasons.extend(_request_reasons(request, judged, node_cordons))
    if unknown:
        reasons.append(f"its claims' own CEL selectors are not judged here: {_listed(_values(unknown))}")
    if len(reasons) > (1 if unknown else 0):
        return Verdict(False, reasons, judged)
    open_gpus = [g for g in gpus if g.schedulable and g.node not in node_cordons]
    name = str((pod.get("metadata") or {}).get("name", ""))
    packed = pack([PodGroup(name, 1, tuple(requests))], open_gpus, {g.key: free[g.key] for g in open_gpus})
    if packed.placements is not None:
        nodes = sorted({p.node for p in packed.placements if p.node})
        reasons.insert(
            0,
            f"its GPU shares fit now (on {_listed(nodes)}): what keeps it waiting is not its GPU "
            "shares, or the scheduler has not tried it again since capacity returned",
        )
        return Verdict(True, reasons, judged)
    groups = [PodGroup(name, 1, tuple(requests))]
    reasons.insert(0, no_fit_message(groups, open_gpus, free, packed.exhausted))
    return Verdict(False, reasons, judged)


def _request_reasons(request: Request, judged: list[GpuJudgement], node_cordons: set[str]) -> list[str]:
    """The sentences for one request, the most basic reason only; each GPU's problem with it is
    appended to its judgement."""
    problems = []
    for j in judged:
        problem = _gpu_problem(j, request, node_cordons)
        j.problems.append(problem)
        problems.append(problem)
    selected = [j for j, p in zip(judged, problems, strict=True) if p != NOT_SELECTED]
    if not selected:
        return [_selection_sentence(request.choices, [j.gpu for j in judged])]
    roomy = [j for j, p in zip(judged, problems, strict=True) if p in ("", CORDONED, TAINTED)]
    if not roomy:
        lines = [p for p in problems if p != NOT_SELECTED]
        more = f"; and {len(lines) - LISTED} more GPUs" if len(lines) > LISTED else ""
        return [f"no GPU the claim may use has room: {'; '.join(lines[:LISTED])}{more}"]
    usable = [j for j, p in zip(judged, problems, strict=True) if p == ""]
    if not usable:
        blocked = roomy
        what = (
            "cordoned" if all(_is_cordoned(j.gpu, node_cordons) for j in blocked) else "cordoned or unhealthy"
        )
        named = [f"{_label(j.gpu)} ({', '.join(_blocking(j.gpu, node_cordons))})" for j in blocked]
        return [f"every GPU that fits is {what}: {_listed(named)}"]
    if request.count > 1:
        per_node: dict[str, list[str]] = {}
        for j in usable:
            per_node.setdefault(j.gpu.node, []).append(cut(j.gpu.uuid or j.gpu.name, VALUE_LIMIT))
        if max(len(v) for v in per_node.values()) < request.count:
            counts = [
                f"{node} has {len(v)} ({', '.join(v[:LISTED])})" for node, v in sorted(per_node.items())
            ]
            return [
                f"the claim asks for {request.count} different GPUs on one node, and no node has "
                f"{request.count} GPUs with room: {_listed(counts)}"
            ]
    return []


NOT_SELECTED = "not selected by the claim"
CORDONED = "cordoned"
TAINTED = "unhealthy"


def _blocking(gpu: PublishedGpu, node_cordons: set[str]) -> list[str]:
    out = list(gpu.blocking_taints)
    if gpu.node in node_cordons:
        out.append("node cordoned")
    return out


def _is_cordoned(gpu: PublishedGpu, node_cordons: set[str]) -> bool:
    return gpu.node in node_cordons or any(is_cordon(t) for t in gpu.blocking_taints)


def _gpu_problem(j: GpuJudgement, request: Request, node_cordons: set[str]) -> str:
    """What stops the judged GPU taking one share of ``request``: '' (nothing), NOT_SELECTED, a
    sentence about its room, or CORDONED / TAINTED."""
    gpu = j.gpu
    matching = [c for c in request.choices if c.matches(gpu)]
    if not matching:
        return NOT_SELECTED
    if not any(c.memory_on(gpu) <= j.free_memory and c.cores <= j.free_cores for c in matching):
        choice = matching[0]
        need = choice.memory_on(gpu)
        if need > j.free_memory:
            return (
                f"{_label(gpu)} has {format_bytes(j.free_memory)} free, the claim asks {format_bytes(need)}"
            )
        return f"{_label(gpu)} has {j.free_cores} cores free, the claim asks {choice.cores}"
    if gpu.blocking_taints or gpu.node in node_cordons:
        return CORDONED if _is_cordoned(gpu, node_cordons) else TAINTED
    return ""


def as_data(verdict: Verdict) -> dict[str, Any]:
    """The verdict as plain data: each GPU's verdict is its problems with the requests, or that it
    has room for them."""
    return {
        "fits": verdict.fits,
        "reasons": list(verdict.reasons),
        "gpus": [
            {
                "node": j.gpu.node,
                "device": j.gpu.name,
                "uuid": j.gpu.uuid,
                "freeMemory": j.free_memory,
                "freeCores": j.free_cores,
                "verdict": "; ".join(dict.fromkeys(p for p in j.problems if p)) or "has room for its shares",
            }
            for j in verdict.gpus
        ],
    }
