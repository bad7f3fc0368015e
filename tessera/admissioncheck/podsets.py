"""What one pod of each of a Workload's PodSets asks for, as requests :mod:`fit` can pack; pure.

Three kinds of pod template, three readings, none of which parses CEL:

- a template that still names ``nvidia.com/gpu``/``gpumem``/``gpumem-percentage``/``gpucores`` (a
  Job's: the webhook converts its pods only when the Job creates them) is read with the core's
  ``container_requests`` and ``selection_for``, the very code the webhook converts pods with;
- a template that references a ResourceClaimTemplate the webhook wrote (a plain pod, converted at
  creation) is read from the request the webhook recorded in the template's annotation
  ``gpu.tessera.dev/gpu-request``, once its spec is seen to ask the same counts, memory and cores
  (a template written by hand to look like the webhook's must not pass a small record off for a big
  request). The record's GPU selection is trusted only when the template is the webhook's own: it
  carries the webhook's managed-by label and exactly the CEL selectors the record implies
  (tessera/selection_cel.py, the text the webhook writes). Otherwise it is read as a template a user
  wrote, below: an extra selector must not hide behind a record that says "any GPU";
- a template that references a ResourceClaimTemplate a user wrote is read from its structure:
  requests of our DeviceClass, ``exactly`` or ``firstAvailable``, sized by their capacity. Its CEL
  selectors cannot be judged here; the share is sized as if any GPU matched, and the Ready message
  names the selectors not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tessera.admissioncheck.fit import Choice, PodGroup, Request
from tessera.admissioncheck.inventory import Key
from tessera.gpu_request import (
    GpuRequest,
    RecordError,
    container_requests,
    request_from_annotation,
    selection_for,
    share_of,
)
from tessera.names import (
    CORES_CAPACITY,
    DEVICE_CLASS,
    GPU_REQUEST_ANNOTATION,
    MANAGED_BY_LABEL,
    MEMORY_CAPACITY,
    WEBHOOK_MANAGED_BY,
)
from tessera.quantity import quantity_to_int
from tessera.selection_cel import selection_cel, size_selector


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
    gpu = request_from_annotation(value)
    recorded = request_of(gpu)
    claim_spec = spec.get("spec") or {}
    if _sizes(requests_from_claim_spec(claim_spec, [])) != _sizes([recorded]):
        raise RecordError(
            f"ResourceClaimTemplate {where} asks for other GPU shares than its annotation "
            f"{GPU_REQUEST_ANNOTATION} records."
        )
    labels = (template.get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) == WEBHOOK_MANAGED_BY and _selectors(claim_spec) == _implied_selectors(
        gpu
    ):
        return [recorded]
    return requests_from_claim_spec(claim_spec, unknown)


def _selectors(claim_spec: Mapping[str, Any]) -> list[list[str]]:
    """The CEL expressions of each request body (``exactly`` or a subrequest) of our class, in order."""
    out: list[list[str]] = []
    for request in (claim_spec.get("devices") or {}).get("requests") or []:
        bodies = [request["exactly"]] if request.get("exactly") else request.get("firstAvailable") or []
        out.extend(
            [(s.get("cel") or {}).get("expression", "") for s in body.get("selectors") or []]
            for body in bodies
            if body.get("deviceClassName") == DEVICE_CLASS
        )
    return out


def _implied_selectors(gpu: GpuRequest) -> list[list[str]]:
    """What :func:`_selectors` reads from the claim spec the webhook writes for ``gpu``
    (tessera/webhook/conversion.py claim_spec): the selection's CEL, after each memory size's
    selector for a converted percentage."""
    own = selection_cel(gpu.selection)
    if gpu.memory is not None:
        return [own]
    return [[size_selector(size), *own] for size in gpu.memory_sizes]


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
