"""Reading a pod's scheduling state without tripping over the Nones of a pod still in flight.

The client's models make every status field optional (a pod just created has no status yet); these
helpers answer the questions tests and the demo ask with None for "not yet".
"""

from __future__ import annotations

from kubernetes import client


def condition(pod: client.V1Pod, kind: str) -> client.V1PodCondition | None:
    """The pod's condition of the given type (PodScheduled, Ready, ...), if it has one yet."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return next((c for c in conditions if c.type == kind), None)


def unschedulable_condition(pod: client.V1Pod) -> client.V1PodCondition | None:
    """PodScheduled=False, which carries the scheduler's reason and message, or None."""
    scheduled = condition(pod, "PodScheduled")
    return scheduled if scheduled is not None and scheduled.status == "False" else None


def bound_node(pod: client.V1Pod) -> str | None:
    """The node the scheduler bound the pod to, or None while it is unbound."""
    return pod.spec.node_name if pod.spec else None


def generated_claim_name(pod: client.V1Pod, claim: str) -> str | None:
    """The name of the ResourceClaim the controller manager made for the pod's claim entry `claim`."""
    statuses = (pod.status.resource_claim_statuses if pod.status else None) or []
    return next((s.resource_claim_name for s in statuses if s.name == claim), None)
