"""One review in, one decision out: which pods are converted, how the patched pod looks, what is
refused, and that every answer is a valid AdmissionReview whatever the pod (property-based)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings

from tessera.names import HAMI_RESOURCES, HAMI_USE_TYPE
from tessera.webhook.admission import admit
from tessera.webhook.review import ReviewRequest
from tests.unit.webhook.webhook_samples import (
    FLEET,
    apply_patch,
    container,
    decoded_patch,
    pod,
    random_pods,
    request,
)

G, MEM, PCT, CORES = HAMI_RESOURCES


def decide(obj: dict[str, Any], **options: Any) -> Any:
    return admit(ReviewRequest(**request(obj, **options)), FLEET)  # type: ignore[typeddict-item]


def patched(obj: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    decision = decide(obj)
    assert decision.outcome == "converted", decision.response
    return apply_patch(obj, decoded_patch(decision.response)), decision.templates


def test_a_gpumem_and_gpucores_container_references_one_template_and_loses_its_extended_resources() -> None:
    obj = pod(container("main", {MEM: 8000, CORES: 30, "cpu": "1"}))
    result, templates = patched(obj)
    [template] = templates
    name = template["metadata"]["name"]
    assert result["spec"]["resourceClaims"] == [{"name": "tessera-main", "resourceClaimTemplateName": name}]
    assert result["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"},
        "claims": [{"name": "tessera-main"}],
    }
    assert template["metadata"]["namespace"] == "team"
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (exactly["count"], exactly["capacity"]["requests"]) == (1, {"memory": "8000Mi", "cores": "30"})


def test_identical_containers_share_one_template_but_each_gets_its_own_claim() -> None:
    obj = pod(container("a", {G: 1, MEM: 1000}), container("b", {G: 1, MEM: 1000}))
    result, templates = patched(obj)
    assert len(templates) == 1
    claims = result["spec"]["resourceClaims"]
    assert [c["name"] for c in claims] == ["tessera-a", "tessera-b"]
    assert claims[0]["resourceClaimTemplateName"] == claims[1]["resourceClaimTemplateName"]


def test_init_containers_and_restartable_sidecars_are_converted_too() -> None:
    sidecar = container("proxy", {CORES: 10}, restartPolicy="Always")
    setup = container("setup", {MEM: 500})
    obj = pod(container("main"), init=[setup, sidecar])
    result, templates = patched(obj)
    assert len(templates) == 2
    assert [c["name"] for c in result["spec"]["resourceClaims"]] == ["tessera-setup", "tessera-proxy"]
    assert result["spec"]["initContainers"][1]["resources"]["claims"] == [{"name": "tessera-proxy"}]
    assert "resources" not in result["spec"]["containers"][0]


def test_existing_claims_and_requests_are_kept_and_appended_to() -> None:
    main = container("main", {G: 1})
    main["resources"]["requests"] = {G: 1, "memory": "1Gi"}
    main["resources"]["claims"] = [{"name": "other"}]
    obj = pod(main)
    obj["spec"]["resourceClaims"] = [{"name": "other", "resourceClaimTemplateName": "someone-elses"}]
    result, _ = patched(obj)
    assert [c["name"] for c in result["spec"]["resourceClaims"]] == ["other", "tessera-main"]
    resources = result["spec"]["containers"][0]["resources"]
    assert resources == {
        "limits": {},
        "requests": {"memory": "1Gi"},
        "claims": [{"name": "other"}, {"name": "tessera-main"}],
    }


def test_a_long_container_name_gets_a_hashed_claim_name_within_63_characters() -> None:
    result, _ = patched(pod(container("c" * 63, {G: 1})))
    [claim] = result["spec"]["resourceClaims"]
    assert claim["name"].startswith("tessera-") and len(claim["name"]) <= 63


def test_annotations_become_selectors_of_every_converted_container() -> None:
    _, templates = patched(pod(container("main", {MEM: 100}), annotations={HAMI_USE_TYPE: "A100"}))
    [selector] = templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert '["a100"]' in selector["cel"]["expression"]


@pytest.mark.parametrize(
    ("obj", "operation"),
    [
        (pod(container("main", {"cpu": "1"})), "CREATE"),
        (pod(container("main")), "CREATE"),
        (pod(container("main", {G: 1})), "UPDATE"),
        (pod(container("main", {G: 1})), "DELETE"),
    ],
    ids=["cpu-only", "no-resources", "update", "delete"],
)
def test_pods_without_gpu_requests_and_other_operations_are_allowed_untouched(
    obj: dict[str, Any], operation: str
) -> None:
    decision = decide(obj, operation=operation)
    assert decision.response["response"] == {"uid": request(obj)["uid"], "allowed": True}
    assert decision.templates == []


def test_a_converted_pod_reinvoked_is_left_as_it_is() -> None:
    result, _ = patched(pod(container("main", {G: 1, MEM: 100})))
    assert decide(result).outcome == "untouched"


@pytest.mark.parametrize(
    ("obj", "phrase"),
    [
        (pod(container("main", {CORES: 120})), 'container "main": nvidia.com/gpucores is 120'),
        (
            pod(container("main"), init=[container("setup", {MEM: 10**6})]),
            'init container "setup": nvidia.com/gpumem',
        ),
        (pod(container("main", {G: 9})), "more GPUs than any node has"),
        (pod(container("main", {G: 1}), annotations={"nvidia.com/use-gpuuuid": ""}), "names no value"),
    ],
)
def test_impossible_requests_are_denied_with_their_sentence(obj: dict[str, Any], phrase: str) -> None:
    decision = decide(obj)
    assert decision.outcome == "denied"
    response = decision.response["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert phrase in response["status"]["message"]
    assert decision.templates == []


def test_a_pod_already_using_our_claim_name_is_denied() -> None:
    obj = pod(container("main", {G: 1}))
    obj["spec"]["resourceClaims"] = [{"name": "tessera-main", "resourceClaimName": "x"}]
    assert "already has a resource claim" in decide(obj).response["response"]["status"]["message"]


# Property: random pod specs never raise, always give a valid review, and patches always apply.


@settings(max_examples=300, deadline=None)
@given(random_pods())
def test_any_pod_gets_a_valid_review_and_a_patch_that_applies(obj: dict[str, Any]) -> None:
    original = copy.deepcopy(obj)
    decision = decide(obj)
    assert obj == original  # the decision never edits the request in place
    review = decision.response
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    response = review["response"]
    assert response["uid"] == request(obj)["uid"]
    if not response["allowed"]:
        assert decision.outcome == "denied" and response["status"]["message"].endswith(".")
        return
    if "patch" not in response:
        assert decision.outcome == "untouched"
        return
    result = apply_patch(obj, decoded_patch(review))
    for section in ("containers", "initContainers"):
        for item in result["spec"].get(section) or []:
            resources = item.get("resources") or {}
            for name in HAMI_RESOURCES:
                assert name not in (resources.get("limits") or {}) and name not in (
                    resources.get("requests") or {}
                )
    claim_names = [c["name"] for c in result["spec"]["resourceClaims"]]
    assert len(claim_names) == len(set(claim_names))
    assert decide(result).outcome == "untouched"
