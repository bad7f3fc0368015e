"""Which existing template the webhook will use: only its own (the managed-by label) with the very
spec it would write, compared as the API stores it. The store's API calls and watch are tested
against the real API server in tests/integration/test_webhook_templates.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tessera.webhook.conversion import Refusal, claim_spec, claim_template, container_requests
from tessera.webhook.templates import check_existing, same_spec
from tests.unit.webhook.webhook_samples import FLEET, container, pod


def template(memory_mib: int = 81920) -> dict[str, Any]:
    spec = pod(container("main", {"nvidia.com/gpumem": memory_mib, "nvidia.com/gpucores": 30}))["spec"]
    ((_, _, _, where, request),) = list(container_requests(spec))
    return claim_template("team", claim_spec(where, request, [], FLEET))


def as_stored(ours: dict[str, Any]) -> dict[str, Any]:
    """The template as the API gives it back: quantities canonical, an empty claim metadata added."""
    stored = copy.deepcopy(ours)
    stored["metadata"]["uid"] = "0f0e"
    stored["spec"]["metadata"] = {}
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
        lambda spec: spec.update(metadata={"labels": {"extra": "yes"}}),
        lambda spec: spec["spec"]["devices"]["requests"][0]["exactly"].update(
            selectors=[{"cel": {"expression": "true"}}]
        ),
    ],
    ids=["more-memory", "more-gpus", "uncapped-cores", "claim-labels", "another-selector"],
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
