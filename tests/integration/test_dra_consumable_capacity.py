"""DRA consumable capacity really shares one device on this control plane.

The objects are written by hand, as Tessera's driver will publish them: one GPU with 80Gi of memory
and 100 cores, both consumable, allowMultipleAllocations on. The real kube-controller-manager makes
the claims from templates and the real kube-scheduler allocates shares. If consumable capacity were
off, the API server would drop allowMultipleAllocations and the second pod could not be placed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from tessera.names import DRIVER_NAME
from testbed import dra_objects, pod_state
from testbed.names import unique_name

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
        claim = pod_state.wait_until_claim_allocated(resource, core, namespace, pod, "gpu")
        result = pod_state.single_allocation_result(claim)
        assert (result.driver, result.pool, result.device) == (DRIVER_NAME, gpu_node, "gpu-0")
        assert result.consumed_capacity == {"memory": "30Gi", "cores": "40"}
        assert result.share_id, "a share of a multi-allocatable device must carry a shareID"
        assert pod_state.wait_until_bound(core, namespace, pod) == gpu_node
        results.append(result)
    assert results[0].share_id != results[1].share_id

    core.create_namespaced_pod(namespace, dra_objects.pod_with_claim("third", "share"))

    condition = pod_state.wait_until_unschedulable(core, namespace, "third")
    assert "cannot allocate all claims" in (condition.message or ""), condition.message
    assert pod_state.bound_node(core.read_namespaced_pod("third", namespace)) is None


def test_a_share_larger_than_the_gpu_is_never_allocated(
    kube: client.ApiClient, namespace: str, device_class: str, gpu_node: str
) -> None:
    """A request above the device's capacity finds no device: the pod stays unschedulable, and a
    wait for it to be placed fails with the scheduler's reason in its report."""
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    resource.create_namespaced_resource_claim_template(
        namespace,
        dra_objects.share_claim_template("too-big", device_class, {"memory": "81Gi", "cores": "10"}),
    )
    core.create_namespaced_pod(namespace, dra_objects.pod_with_claim("big", "too-big"))

    condition = pod_state.wait_until_unschedulable(core, namespace, "big")
    assert "cannot allocate all claims" in (condition.message or ""), condition.message
    with pytest.raises(TimeoutError) as waited:
        pod_state.wait_until_bound(core, namespace, "big", timeout=0.5)
    report = str(waited.value)
    assert "condition PodScheduled=False Unschedulable: " in report, report
    assert "cannot allocate all claims" in report.split("events:")[0], report
    assert "claim gpu: big-gpu-" in report and "events:" in report, report
