"""HAMi's placement annotations, each answered: honoured by what Kubernetes already does, or a
warning naming the annotation and what happens instead; pure.

What Kubernetes 1.37 does (kubernetes/kubernetes, staging/src/k8s.io/dynamic-resource-allocation/
structured/internal/*/allocator_*.go, and pkg/scheduler/framework/plugins/dynamicresources):

- Within a node the allocator walks pools, slices and devices in order and takes the first device
  whose selectors match and whose remaining capacity holds the request: first fit over the GPUs in
  the order the driver publishes them, so a share goes to the first GPU that still has room. That
  is HAMi's GPU ``binpack``: honoured.
- Nothing in a claim can ask for the opposite (an emptier GPU first), for a GPU with nothing else on
  it (CEL sees a device's attributes and capacity, never what is allocated), or for GPUs close to
  each other (the driver publishes no NVLink or NUMA attribute a constraint could match):
  ``spread``, ``mutex``, ``topology-aware`` and ``numa`` are not honoured.
- The DRA plugin scores nodes only by the ``firstAvailable`` choice a claim would get; nothing
  scores how full a node's GPUs are, so node ``binpack``/``spread`` and HAMi's scoring weights are
  not honoured: the scheduler's own node scoring decides.

Warnings are at most :data:`MAX_WARNING` characters (the API server may cut longer ones) and quote
user text only through ``quote``.
"""

from __future__ import annotations

from collections.abc import Mapping

from tessera.gpu_request import MAX_ANNOTATION_LENGTH
from tessera.names import HAMI_GPU_POLICY, HAMI_NODE_POLICY, HAMI_SCORING_WEIGHTS
from tessera.quantity import quote

MAX_WARNING = 256
"""Characters of one admission warning that the API server passes on whole."""

MAX_POLICIES = 8
"""Entries of a policy list read; HAMi knows five GPU policies, so more is a mistake."""

_NODE_SCORING = "nodes are chosen by the scheduler's own scoring, which does not count GPU use"

GPU_POLICIES: Mapping[str, str | None] = {
    "binpack": None,
    "spread": "each share goes to the first GPU in the node with room (binpack); nothing in a claim "
    "asks for the emptier GPU",
    "mutex": "the share may land on a GPU that others share; for a GPU of its own ask "
    "nvidia.com/gpumem-percentage: 100 and nvidia.com/gpucores: 100",
    "topology-aware": "GPUs are chosen without regard to NVLink topology, which the driver does not publish",
    "numa": "GPUs are chosen without regard to NUMA nodes, which the driver does not publish",
}
"""HAMi's GPU policies: None where Kubernetes honours it, else what happens instead."""

NODE_POLICIES: Mapping[str, str | None] = {"binpack": _NODE_SCORING, "spread": _NODE_SCORING}
"""HAMi's node policies, none of which Kubernetes' scoring can honour for DRA devices."""


def _entries(value: str) -> list[str]:
    """The comma-separated entries of a policy value, trimmed and lower-cased, at most
    :data:`MAX_POLICIES` distinct ones (the caller bounds the value's length)."""
    entries = (entry.strip().lower() for entry in value.split(","))
    return list(dict.fromkeys(entries))[:MAX_POLICIES]


def _policy_warnings(annotation: str, value: str, known: Mapping[str, str | None]) -> list[str]:
    if len(value) > MAX_ANNOTATION_LENGTH:
        return [f"{annotation} is longer than {MAX_ANNOTATION_LENGTH} characters and is ignored."]
    warnings = []
    for entry in _entries(value):
        if entry not in known:
            names = ", ".join(known)
            warnings.append(
                f"{annotation} {quote(entry)} is not one of HAMi's policies ({names}) and is ignored."
            )
        elif known[entry] is not None:
            warnings.append(f"{annotation} {entry} is not honoured: {known[entry]}.")
    return warnings


def policy_warnings(annotations: Mapping[str, str]) -> list[str]:
    """The warnings for the pod's placement annotations, in a fixed order; none for what is
    honoured."""
    warnings = []
    if HAMI_GPU_POLICY in annotations:
        warnings += _policy_warnings(HAMI_GPU_POLICY, annotations[HAMI_GPU_POLICY], GPU_POLICIES)
    if HAMI_NODE_POLICY in annotations:
        warnings += _policy_warnings(HAMI_NODE_POLICY, annotations[HAMI_NODE_POLICY], NODE_POLICIES)
    if HAMI_SCORING_WEIGHTS in annotations:
        warnings.append(f"{HAMI_SCORING_WEIGHTS} is not honoured: {_NODE_SCORING}, and GPUs go first fit.")
    return [warning[:MAX_WARNING] for warning in warnings]
