"""DRA consumable capacity really shares one device on this control plane.

The objects are written by hand, as Tessera's driver will publish them: one GPU with 80Gi of memory
and 100 cores, both consumable, allowMultipleAllocations on. The real kube-controller-manager makes
the claims from templates and the real kube-scheduler allocates shares. If consumable capacity were
off, the API server would drop allowMultipleAllocations and the second pod could not be placed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from tessera.testbed import dra_objects, pod_state
from tessera.testbed.names import unique_name
from tessera.testbed.polling import poll_until

pytestmark = pytest.mark.integration


@pytest.fixture
def device_class(kube: client.ApiClient) -> Iterator[str]:
    resource = client.ResourceV1Api(kube)
    name = unique_name("gpu-class")
    resource.create_device_class(dra_objects.device_class(name))
    yield name
    resource.delete_device_class(name)


@pytest.fixture
def gpu_node(kube: client.ApiClient, fake_node: Callable[..., str]) -> Iterator[str]:
    """A Ready node publishing one shareable GPU: 80Gi in 1Mi steps, 100 cores in steps of 1."""
    node = fake_node()
    resource = client.ResourceV1Api(kube)
    slice_name = unique_name("slice")
    resource.create_resource_slice(dra_objects.shareable_gpu_slice(slice_name, node))
    yield node
    resource.delete_resource_slice(slice_name)


def allocated_claim(kube: client.ApiClient, namespace: str, pod: str) -> client.ResourceV1ResourceClaim:
    """The pod's generated ResourceClaim once the scheduler has allocated it."""
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)

    def check() -> client.ResourceV1ResourceClaim | None:
        name = pod_state.generated_claim_name(core.read_namespaced_pod(pod, namespace), "gpu")
        if name is None:
            return None
        claim = resource.read_namespaced_resource_claim(name, namespace)
        return claim if claim.status and claim.status.allocation else None

    return poll_until(check, 60, f"allocation of {pod}'s claim")


def allocation_result(claim: client.ResourceV1ResourceClaim) -> client.V1DeviceRequestAllocationResult:
    """The single device result of a one-request claim."""
    assert claim.status and claim.status.allocation and claim.status.allocation.devices
    (result,) = claim.status.allocation.devices.results or []
    assert isinstance(result, client.V1DeviceRequestAllocationResult)
    return result


def bound_node(core: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    return pod_state.bound_node(core.read_namespaced_pod(pod, namespace))


def unschedulable(core: client.CoreV1Api, namespace: str, pod: str) -> client.V1PodCondition:
    """Wait for the scheduler to give up on the pod; its PodScheduled=False condition says why."""
    condition = poll_until(
        lambda: pod_state.unschedulable_condition(core.read_namespaced_pod(pod, namespace)),
        60,
        f"PodScheduled=False on {pod}",
    )
    assert condition.reason == "Unschedulable"
    return condition


def test_two_shares_of_one_gpu_and_a_third_that_does_not_fit(
    kube: client.ApiClient, namespace: str, device_class: str, gpu_node: str
) -> None:
    """Two pods asking 30Gi/40 cores share the one 80Gi GPU with distinct shareIDs and exactly the
    capacity they asked for; a third asking 30Gi more stays Pending and says why."""
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    resource.create_namespaced_resource_claim_template(
        namespace, dra_objects.share_claim_template("share", device_class, {"memory": "30Gi", "cores": "40"})
    )
    for pod in ("first", "second"):
        core.create_namespaced_pod(namespace, dra_objects.pod_with_claim(pod, "share"))

    results = []
    for pod in ("first", "second"):
        result = allocation_result(allocated_claim(kube, namespace, pod))
        assert (result.driver, result.pool, result.device) == (dra_objects.DRIVER, gpu_node, "gpu-0")
        assert result.consumed_capacity == {"memory": "30Gi", "cores": "40"}
        assert result.share_id, "a share of a multi-allocatable device must carry a shareID"
        bound = poll_until(functools.partial(bound_node, core, namespace, pod), 30, f"{pod} bound")
        assert bound == gpu_node
        results.append(result)
    assert results[0].share_id != results[1].share_id

    core.create_namespaced_pod(namespace, dra_objects.pod_with_claim("third", "share"))

    condition = unschedulable(core, namespace, "third")
    assert "cannot allocate all claims" in (condition.message or ""), condition.message
    assert pod_state.bound_node(core.read_namespaced_pod("third", namespace)) is None


def test_a_share_larger_than_the_gpu_is_never_allocated(
    kube: client.ApiClient, namespace: str, device_class: str, gpu_node: str
) -> None:
    """A request above the device's capacity finds no device: the pod stays unschedulable."""
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    resource.create_namespaced_resource_claim_template(
        namespace,
        dra_objects.share_claim_template("too-big", device_class, {"memory": "81Gi", "cores": "10"}),
    )
    core.create_namespaced_pod(namespace, dra_objects.pod_with_claim("big", "too-big"))

    condition = unschedulable(core, namespace, "big")
    assert "cannot allocate all claims" in (condition.message or ""), condition.message
