"""Property: whatever pod the webhook converts, the patched pod and its templates pass the real
apiserver's validation (server-side dry run, so nothing is stored) — the CEL of every selector
included, which the apiserver compiles when it validates a template."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import client
from kubernetes.client import ApiException

from tessera.webhook.admission import admit
from tessera.webhook.review import ReviewRequest
from testbed.names import unique_name
from tests.unit.webhook.webhook_samples import FLEET, apply_patch, decoded_patch, random_pods, request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plain_namespace(kube: client.ApiClient) -> Iterator[str]:
    """A namespace of this module's own (hypothesis calls the test many times with one fixture value)."""
    core = client.CoreV1Api(kube)
    name = unique_name("wh-valid")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=random_pods(hami_only=True))
def test_every_converted_pod_and_template_passes_the_apiservers_validation(
    kube: client.ApiClient, plain_namespace: str, obj: dict[str, Any]
) -> None:
    obj = copy.deepcopy(obj)
    obj["metadata"]["name"] = "random"
    obj["metadata"]["namespace"] = plain_namespace
    decision = admit(ReviewRequest(**request(obj)), FLEET)  # type: ignore[typeddict-item]
    if decision.outcome != "converted":
        return
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    for template in decision.templates:
        template["metadata"]["namespace"] = plain_namespace
        resource.create_namespaced_resource_claim_template(
            plain_namespace, client.V1ResourceClaimTemplate.model_validate(template), dry_run="All"
        )
    patched = apply_patch(obj, decoded_patch(decision.response))
    try:
        core.create_namespaced_pod(plain_namespace, client.V1Pod.model_validate(patched), dry_run="All")
    except ApiException as error:
        raise AssertionError(f"apiserver refused the converted pod: {error.body}") from None
