"""The decision for one AdmissionReview request: allow untouched, deny with a sentence, or patch with
the templates to create; pure, so every rule is a table-driven unit test.

Re-invocation is safe by construction: a converted pod no longer names any HAMi resource, so a
second pass finds nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera.gpu_request import AnnotationError, RecordError, Refusal, container_requests, selection_for
from tessera.webhook import review
from tessera.webhook.conversion import claim_template
from tessera.webhook.fleet import Fleet
from tessera.webhook.mutation import Converted, pod_patch
from tessera.webhook.review import AdmissionReview, ReviewRequest
from tessera.webhook.validation import check_against_fleet


@dataclass
class Decision:
    """The response to send, the templates (JSON) that must exist first, and the outcome for metrics:
    ``ignored`` (not a pod CREATE), ``untouched``, ``converted`` or ``denied``."""

    response: AdmissionReview
    outcome: str
    templates: list[dict[str, Any]] = field(default_factory=list)


def admit(request: ReviewRequest, fleet: Fleet) -> Decision:
    uid = request["uid"]
    pod = request.get("object")
    if request.get("operation") != "CREATE" or request.get("kind", {}).get("kind") != "Pod" or not pod:
        return Decision(review.allow(uid), "ignored")
    # review.check_request made sure this is the pod's own namespace: templates go nowhere else.
    namespace = request.get("namespace", "")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    spec = pod.get("spec") or {}
    try:
        selection = selection_for(annotations)
        converted: list[Converted] = []
        templates: dict[str, dict[str, Any]] = {}
        for list_name, index, container, where, gpu in container_requests(spec, selection):
            check_against_fleet(where, gpu, fleet)
            template = claim_template(namespace, where, gpu, fleet)
            name = template["metadata"]["name"]
            templates.setdefault(name, template)
            converted.append(Converted(list_name, index, container, name))
    except (Refusal, AnnotationError, RecordError) as refusal:
        return Decision(review.deny(uid, str(refusal)), "denied")
    if not converted:
        return Decision(review.allow(uid), "untouched")
    taken = {entry.get("name") for entry in spec.get("resourceClaims") or []}
    for item in converted:
        if item.claim_name in taken:
            message = f'pod already has a resource claim named "{item.claim_name}", which Tessera needs.'
            return Decision(review.deny(uid, message), "denied")
    return Decision(review.patch(uid, pod_patch(pod, converted)), "converted", list(templates.values()))
