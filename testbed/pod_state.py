"""Reading and waiting for a pod's scheduling state, without tripping over the Nones of a pod in flight.

The client's models make every status field optional (a pod just created has no status yet); these
helpers answer the questions tests and the demo ask with None for "not yet", and the wait_until_*
ones poll until the answer is there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kubernetes import client

from tessera.kube import raw_json
from testbed.polling import poll_until

T = TypeVar("T")


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


def wait_until_bound(core: client.CoreV1Api, namespace: str, pod: str, timeout: float = 60) -> str:
    """Wait for the scheduler to bind the pod; return the node's name."""
    return wait_for_pod(
        core,
        namespace,
        pod,
        lambda: bound_node(core.read_namespaced_pod(pod, namespace)),
        timeout,
        f"{namespace}/{pod} bound",
    )


def wait_until_unschedulable(
    core: client.CoreV1Api, namespace: str, pod: str, timeout: float = 60
) -> client.V1PodCondition:
    """Wait for the scheduler to give up on the pod; its PodScheduled=False condition says why."""
    condition = wait_for_pod(
        core,
        namespace,
        pod,
        lambda: unschedulable_condition(core.read_namespaced_pod(pod, namespace)),
        timeout,
        f"PodScheduled=False on {namespace}/{pod}",
    )
    if condition.reason != "Unschedulable":
        raise AssertionError(f"{namespace}/{pod} not scheduled for another reason: {condition.reason}")
    return condition


def wait_until_claim_allocated(
    resource: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
    pod: str,
    claim: str,
    timeout: float = 60,
) -> client.ResourceV1ResourceClaim:
    """Wait for the ResourceClaim made for the pod's claim entry `claim` to be allocated; return it."""

    def allocated() -> client.ResourceV1ResourceClaim | None:
        name = generated_claim_name(core.read_namespaced_pod(pod, namespace), claim)
        if name is None:
            return None
        made = resource.read_namespaced_resource_claim(name, namespace)
        return made if made.status and made.status.allocation else None

    return wait_for_pod(
        core, namespace, pod, allocated, timeout, f"allocation of {namespace}/{pod}'s claim {claim}"
    )


def single_allocation_result(claim: client.ResourceV1ResourceClaim) -> client.V1DeviceRequestAllocationResult:
    """The one device result of an allocated claim with a single request for one device."""
    devices = claim.status.allocation.devices if claim.status and claim.status.allocation else None
    results = (devices.results if devices else None) or []
    if len(results) != 1:
        raise AssertionError(f"expected one allocation result, got {len(results)}")
    result: client.V1DeviceRequestAllocationResult = results[0]
    return result


def events(kube: client.ApiClient, namespace: str) -> str:
    """The namespace's events, one "<object>: <reason>: <message>" line each (for failure reports)."""
    items = raw_json(client.CoreV1Api(kube).list_namespaced_event(namespace, _preload_content=False))["items"]
    return "\n".join(f"{e['involvedObject']['name']}: {e['reason']}: {e['message']}" for e in items)


def sections(log: str) -> dict[str, dict[str, str]]:
    """A script's "== name" sections (tests/shim/programs/shim_probe.c prints key=value pairs), each
    as its key=value pairs; the first value of a key in a section wins."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in log.splitlines():
        if line.startswith("== "):
            current = out.setdefault(line[3:].strip(), {})
            continue
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep:
                current.setdefault(key, value)
    return out


def wait_for_pod(
    core: client.CoreV1Api, namespace: str, pod: str, check: Callable[[], T | None], timeout: float, what: str
) -> T:
    """poll_until, and on a timeout what the pod's conditions and its namespace's events say: a
    pod left Pending on a busy machine must tell slow from stuck (a scheduling attempt that failed
    and was never retried, a claim never made) in the one report a CI run keeps."""
    try:
        return poll_until(check, timeout, what)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{pod_account(core, namespace, pod)}") from error


def pod_account(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    """The pod's phase, node, conditions, container states and claim statuses and its namespace's
    events, as lines of text."""
    try:
        read = core.read_namespaced_pod(pod, namespace)
        status = read.status
        lines = [f"phase {status.phase if status else None} on node {bound_node(read)}"]
        lines += [
            f"condition {c.type}={c.status} {c.reason or ''}: {c.message or ''}"
            for c in (status.conditions if status else None) or []
        ]
        lines += [
            f"container {c.name}: {_container_state(c.state)} (restarts: {c.restart_count})"
            for c in (status.container_statuses if status else None) or []
        ]
        lines += [
            f"claim {s.name}: {s.resource_claim_name}"
            for s in (status.resource_claim_statuses if status else None) or []
        ]
        return "\n".join([f"pod {namespace}/{pod}:", *lines, "events:", events(core.api_client, namespace)])
    except Exception as error:  # the report must not hide the timeout it explains
        return f"pod {namespace}/{pod}: could not be read ({error})"


def _container_state(state: client.V1ContainerState | None) -> str:
    """ "waiting: <reason>: <message>" (ContainerCreating, ErrImageNeverPull...), "running" or
    "terminated: <reason> (exit <code>)"."""
    if state is None:
        return "no state yet"
    if state.waiting is not None:
        return f"waiting: {state.waiting.reason or ''}: {state.waiting.message or ''}"
    if state.terminated is not None:
        return f"terminated: {state.terminated.reason or ''} (exit {state.terminated.exit_code})"
    return "running"
