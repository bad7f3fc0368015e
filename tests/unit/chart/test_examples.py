"""examples/: every manifest asks for a Tessera share, and runs the one image the chart's `helm test`
pods use too, so a node without a registry needs one imported image for both (examples/README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.names import DEVICE_CLASS, HAMI_GPUMEM
from tests.chart_helm import CHART, REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def pod_specs(document: dict[str, Any]) -> list[dict[str, Any]]:
    if document["kind"] == "Pod":
        return [document["spec"]]
    if document["kind"] in ("Deployment", "Job"):
        return [document["spec"]["template"]["spec"]]
    return []


def test_the_five_scenarios_are_there() -> None:
    assert {p.name for p in EXAMPLES} == {
        "hami-pod.yaml",
        "claim-template-pod.yaml",
        "deployment.yaml",
        "job.yaml",
        "shared-claim-pod.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_each_example_asks_for_a_share_and_runs_the_helm_test_image(path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    tests_image = yaml.safe_load((CHART / "values.yaml").read_text())["tests"]["image"]
    image = f"{tests_image['repository']}:{tests_image['tag']}"
    templates = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ResourceClaimTemplate"}
    for template in templates.values():
        for request in template["spec"]["spec"]["devices"]["requests"]:
            assert request["exactly"]["deviceClassName"] == DEVICE_CLASS
    specs = [spec for d in documents for spec in pod_specs(d)]
    assert specs
    for spec in specs:
        claims = {c["name"]: c for c in spec.get("resourceClaims", [])}
        assert all(c["resourceClaimTemplateName"] in templates for c in claims.values())
        for container in spec["containers"]:
            assert (container["image"], container["imagePullPolicy"]) == (image, "IfNotPresent")
            resources = container["resources"]
            named = [c["name"] for c in resources.get("claims", [])]
            assert named or HAMI_GPUMEM in resources.get("limits", {}), container["name"]
            assert all(n in claims for n in named)
            assert "$TESSERA_LIMITS_FILE" in container["command"][-1]


def test_the_shared_claim_pod_names_one_claim_in_both_containers() -> None:
    (pod,) = [
        d
        for d in yaml.safe_load_all((REPO / "examples" / "shared-claim-pod.yaml").read_text())
        if d["kind"] == "Pod"
    ]
    claims = [
        [c["name"] for c in container["resources"]["claims"]] for container in pod["spec"]["containers"]
    ]
    assert len(claims) == 2 and claims[0] == claims[1] == ["gpu"]
