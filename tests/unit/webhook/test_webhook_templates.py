"""Which existing template the webhook will use: only its own (the managed-by label) with the very
spec it would write, compared as the API stores it. The store's API calls and watch are tested
against the real API server in tests/integration/test_webhook_templates.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tessera.gpu_request import GpuRequest, Refusal, container_requests, request_to_annotation
from tessera.names import GPU_REQUEST_ANNOTATION
from tessera.quantity import MiB
from tessera.webhook.conversion import claim_template
from tessera.webhook.templates import check_existing, same_spec
from tests.unit.webhook.webhook_samples import FLEET, container, pod


def template(memory_mib: int = 81920) -> dict[str, Any]:
    spec = pod(container("main", {"nvidia.com/gpumem": memory_mib, "nvidia.com/gpucores": 30}))["spec"]
    ((_, _, _, where, request),) = list(container_requests(spec))
    return claim_template("team", where, request, FLEET)


def as_stored(ours: dict[str, Any]) -> dict[str, Any]:
    """The template as the API gives it back: quantities canonical."""
    stored = copy.deepcopy(ours)
    stored["metadata"]["uid"] = "0f0e"
    capacity = stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
    assert capacity["memory"] == "81920Mi"
    capacity["memory"] = "80Gi"
    return stored


def test_the_webhooks_own_template_as_the_api_stores_it_is_used() -> None:
    ours = template()
    check_existing(as_stored(ours), ours)
    assert same_spec(as_stored(ours)["spec"], ours["spec"])


def test_a_template_without_the_label_is_refused_by_name() -> None:
    ours = template()
    planted = as_stored(ours)
    planted["metadata"]["labels"] = {}
    name = ours["metadata"]["name"]
    with pytest.raises(Refusal) as refused:
        check_existing(planted, ours)
    assert str(refused.value) == (
        f"ResourceClaimTemplate team/{name} already exists without the label "
        "app.kubernetes.io/managed-by=tessera-webhook, so Tessera did not make it and will not use it; "
        "delete it and create the pod again."
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda spec: spec["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"].update(
            memory="81921Mi"
        ),
        lambda spec: spec["spec"]["devices"]["requests"][0]["exactly"].update(count=2),
        lambda spec: spec["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"].pop("cores"),
        lambda spec: spec["metadata"].update(labels={"extra": "yes"}),
        lambda spec: spec["spec"]["devices"]["requests"][0]["exactly"].update(
            selectors=[{"cel": {"expression": "true"}}]
        ),
        lambda spec: spec["metadata"]["annotations"].update(
            {GPU_REQUEST_ANNOTATION: request_to_annotation(GpuRequest(1, 1024 * MiB, None, 30))}
        ),
        lambda spec: spec["metadata"].pop("annotations"),
    ],
    ids=[
        "more-memory",
        "more-gpus",
        "uncapped-cores",
        "claim-labels",
        "another-selector",
        "record-of-a-smaller-request",
        "no-record",
    ],
)
def test_a_labelled_template_with_another_spec_is_refused_by_name(change: Any) -> None:
    ours = template()
    planted = as_stored(ours)
    change(planted["spec"])
    with pytest.raises(Refusal) as refused:
        check_existing(planted, ours)
    assert str(refused.value) == (
        f"ResourceClaimTemplate team/{ours['metadata']['name']} already exists with a spec other than "
        "the one Tessera writes for this pod, so Tessera will not use it; delete it and create the pod again."
    )


def test_the_record_and_the_cel_of_another_pod_do_not_make_a_template_tessera_uses() -> None:
    """A template whose CEL (and sizes) are what the webhook writes for one pod and whose record is
    what it writes for another: each half is Tessera's, the whole is not, and it is refused."""
    ours = template()
    other = template(memory_mib=1024)
    planted = as_stored(ours)
    planted["spec"]["metadata"] = other["spec"]["metadata"]
    with pytest.raises(Refusal, match="already exists with a spec other than the one Tessera writes"):
        check_existing(planted, ours)
