"""The webhook's bound on a selector is the API server's own: a template whose selection makes a
selector exactly as long as the webhook lets through is accepted by the real API server (its CEL
compiled and costed), and the same selector one character longer is refused by it, which is why
the webhook refuses it first, in a sentence (tests/unit/common/test_selection_cel.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.gpu_request import AnnotationError, GpuRequest, Selection
from tessera.quantity import GiB
from tessera.selection_cel import CEL_EXPRESSION_MAX_LENGTH, selection_cel
from tessera.webhook.conversion import claim_template
from tessera.webhook.fleet import Fleet

pytestmark = pytest.mark.integration


def longest_kept_type() -> str:
    """A use-gputype entry of "é" (six characters of CEL each) making the longest selector kept."""
    count = 1
    while True:
        try:
            selection_cel(Selection(use_types=("é" * (count + 1),)))
        except AnnotationError:
            return "é" * count
        count += 1


def template_for(namespace: str, types: tuple[str, ...]) -> dict[str, Any]:
    request = GpuRequest(
        count=1, memory=GiB, memory_percent=None, cores=None, selection=Selection(use_types=types)
    )
    return claim_template(namespace, 'container "c"', request, Fleet((80 * GiB,), 8))


def create(kube: client.ApiClient, namespace: str, template: dict[str, Any]) -> None:
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(
        namespace, client.V1ResourceClaimTemplate.model_validate(template)
    )


def test_a_selector_at_the_webhooks_bound_is_accepted_and_one_character_more_is_refused_by_the_api(
    kube: client.ApiClient, namespace: str
) -> None:
    template = template_for(namespace, (longest_kept_type(),))
    body = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    (selector,) = body["selectors"]
    expression = selector["cel"]["expression"]
    assert CEL_EXPRESSION_MAX_LENGTH - 6 < len(expression) <= CEL_EXPRESSION_MAX_LENGTH
    create(kube, namespace, template)

    longer = copy.deepcopy(template)
    longer["metadata"]["name"] += "-longer"
    padding = CEL_EXPRESSION_MAX_LENGTH + 1 - len(expression)
    longer_body = longer["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    longer_body["selectors"][0]["cel"]["expression"] = expression.replace("[", "[" + " " * padding, 1)
    assert len(longer_body["selectors"][0]["cel"]["expression"]) == CEL_EXPRESSION_MAX_LENGTH + 1
    with pytest.raises(ApiException) as refused:
        create(kube, namespace, longer)
    assert refused.value.status == 422
    assert f"may not be more than {CEL_EXPRESSION_MAX_LENGTH} bytes" in str(refused.value.body), (
        refused.value.body
    )
