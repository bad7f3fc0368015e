"""The decision for one AdmissionReview request: allow untouched, deny with a sentence, or patch with
the templates to create; pure, so every rule is a table-driven unit test.

Beside the conversion, two decisions are the administrator's (:class:`AdmissionPolicy`, from the
chart): which namespaces may ask priority 0 (tessera/priority_grant.py), and what happens to a
container whose share the shim enforces but whose seccomp profile would let it unshare its way past
the shim (tessera/webhook/seccomp.py). Such a container may not mount a volume over the claim's files
either (tessera/webhook/reserved_paths.py).

Re-invocation is safe by construction: a converted pod no longer names any HAMi resource, so a
second pass finds nothing to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.gpu_request import (
    AnnotationError,
    RecordError,
    Refusal,
    Selection,
    containers,
    read_mig,
    read_request,
    selection_for,
)
from tessera.names import (
    HAMI_MIG_PREFIX,
    HAMI_NOUSE_TYPE,
    HAMI_NOUSE_UUID,
    HAMI_PRIORITY,
    HAMI_USE_TYPE,
    HAMI_USE_UUID,
    HAMI_VGPU_MODE,
)
from tessera.priority_grant import HIGH_PRIORITY, granted, refusal
from tessera.quantity import quote
from tessera.webhook import reserved_paths, review, seccomp
from tessera.webhook.conversion import claim_template, mig_claim_template
from tessera.webhook.fleet import Fleet
from tessera.webhook.mutation import Converted, pod_patch
from tessera.webhook.notices import annotation_warnings, bounded, env_warnings
from tessera.webhook.policies import MAX_WARNING, policy_warnings
from tessera.webhook.review import AdmissionReview, ReviewRequest
from tessera.webhook.validation import check_against_fleet

SHARE_MODE = "hami-core"
"""The one ``nvidia.com/vgpu-mode`` Tessera has: shares enforced in the container (HAMi-core's way)."""


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the administrator decided, through the chart: the namespaces whose pods may ask
    ``nvidia.com/priority: 0``, and the seccomp mode (one of :data:`seccomp.MODES`) for containers
    whose share the shim enforces. The defaults are the chart's: no namespace, ``enforce``."""

    high_priority_namespaces: frozenset[str] = frozenset()
    seccomp: str = seccomp.ENFORCE


DEFAULT_POLICY = AdmissionPolicy()


@dataclass
class Decision:
    """The response to send, the templates (JSON) that must exist first, and the outcome for metrics:
    ``ignored`` (not a pod CREATE), ``untouched``, ``converted`` or ``denied``."""

    response: AdmissionReview
    outcome: str
    templates: list[dict[str, Any]] = field(default_factory=list)


def _some(items: Sequence[str], shown: int = 3) -> str:
    """Up to ``shown`` of ``items``, quoted, and how many more: a warning names examples, not all."""
    text = ", ".join(quote(item) for item in items[:shown]) or "none"
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")


def _mode_refusal(annotations: dict[str, Any], shares: bool) -> str | None:
    """The denial for ``nvidia.com/vgpu-mode``, None when it is honoured: "hami-core" is what shares
    are, and "mig" on a pod that asks only static MIG instances is what it gets."""
    mode = annotations.get(HAMI_VGPU_MODE)
    if mode is None or mode == SHARE_MODE or (mode == "mig" and not shares):
        return None
    if mode == "mig":
        return (
            f'annotation {HAMI_VGPU_MODE} "mig" asks for dynamic MIG, which Tessera does not do; ask '
            f"{HAMI_MIG_PREFIX}<profile> for an instance of a GPU an operator put in MIG mode."
        )
    return (
        f"annotation {HAMI_VGPU_MODE} is {quote(mode)}; Tessera shares GPUs only in mode "
        f'"{SHARE_MODE}" (or asks {HAMI_MIG_PREFIX}<profile> for MIG instances).'
    )


def _selection_warning(selection: Selection, fleet: Fleet) -> str | None:
    """A warning when the pod's use/nouse annotations leave no published GPU: the pod would wait
    Pending with the scheduler's generic message, while the webhook knows what the cluster has."""
    if selection == Selection() or not fleet.memory_sizes or fleet.has_match(selection):
        return None
    given = [
        name
        for name, entries in (
            (HAMI_USE_UUID, selection.use_uuids),
            (HAMI_NOUSE_UUID, selection.nouse_uuids),
            (HAMI_USE_TYPE, selection.use_types),
            (HAMI_NOUSE_TYPE, selection.nouse_types),
        )
        if entries is not None
    ]
    uuids = f"; GPUs {_some(fleet.uuids, 2)}" if selection.names_uuids else ""
    return (
        f"{', '.join(given)}: no published GPU matches (products {_some(sorted(fleet.products))}{uuids}), "
        "so the pod waits Pending until one joins."
    )[:MAX_WARNING]


def admit(request: ReviewRequest, fleet: Fleet, policy: AdmissionPolicy = DEFAULT_POLICY) -> Decision:
    uid = request["uid"]
    pod = request.get("object")
    if request.get("operation") != "CREATE" or request.get("kind", {}).get("kind") != "Pod" or not pod:
        return Decision(review.allow(uid), "ignored")
    # review.check_request made sure this is the pod's own namespace: templates go nowhere else.
    namespace = request.get("namespace", "")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    spec = pod.get("spec") or {}
    warnings: list[str] = []
    try:
        selection = selection_for(annotations)
        converted: list[Converted] = []
        templates: dict[str, dict[str, Any]] = {}
        shimmed: list[seccomp.ShimContainer] = []
        shares = False
        for list_name, index, container, where in containers(spec):
            mig = read_mig(where, container)
            gpu = read_request(where, container, selection)
            if mig is not None:
                template = mig_claim_template(namespace, mig, selection)
                if mig.profile not in fleet.mig_profiles:
                    warnings.append(
                        f"{where}: no GPU publishes MIG profile {quote(mig.profile)} (the cluster has "
                        f"{_some(sorted(fleet.mig_profiles))}), so the pod waits Pending until one does."
                    )
            elif gpu is not None:
                check_against_fleet(where, gpu, fleet)
                if gpu.priority == HIGH_PRIORITY and not granted(namespace, policy.high_priority_namespaces):
                    raise Refusal(f"{where}: {HAMI_PRIORITY} 0 (high) {refusal(namespace)}.")
                template = claim_template(namespace, where, gpu, fleet)
                shares = True
                if gpu.enforce:
                    shimmed.append(seccomp.ShimContainer(list_name, index, container, where))
            else:
                continue
            warnings += env_warnings(where, container, gpu)
            name = template["metadata"]["name"]
            templates.setdefault(name, template)
            converted.append(Converted(list_name, index, container, name))
        if converted:
            mode_refusal = _mode_refusal(annotations, shares)
            if mode_refusal:
                raise Refusal(mode_refusal)
        reserved_paths.review((item.where, item.container) for item in shimmed)
        confinement, confinement_warnings = seccomp.review(spec, shimmed, policy.seccomp)
    except (Refusal, AnnotationError, RecordError) as refused:
        return Decision(review.deny(uid, str(refused)), "denied")
    if not converted:
        return Decision(review.allow(uid), "untouched")
    taken = {entry.get("name") for entry in spec.get("resourceClaims") or []}
    for item in converted:
        if item.claim_name in taken:
            message = f'pod already has a resource claim named "{item.claim_name}", which Tessera needs.'
            return Decision(review.deny(uid, message), "denied")
    selection_warning = _selection_warning(selection, fleet) if shares else None
    warnings += [selection_warning] if selection_warning else []
    warnings += confinement_warnings + policy_warnings(annotations) + annotation_warnings(annotations)
    response = review.patch(uid, pod_patch(pod, converted) + confinement, bounded(warnings))
    return Decision(response, "converted", list(templates.values()))
