"""Reading a Workload's PodSets: a Job's template with HAMi resources (the core's reading, as the
webhook reads its pods), a plain pod's ResourceClaimTemplates (the request the webhook recorded, or a
hand-written template's structure), and what asks for no GPU."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tessera.admissioncheck.fit import Choice, PodGroup, Request
from tessera.admissioncheck.podsets import (
    Undecidable,
    pod_groups,
    requests_from_claim_spec,
    requests_from_claim_template,
)
from tessera.gpu_request import RecordError, Refusal, Selection, selection_for
from tessera.names import GPU_REQUEST_ANNOTATION
from tessera.quantity import GiB, MiB
from tessera.selection_cel import selection_cel
from tessera.webhook.admission import admit
from tests.unit.webhook.webhook_samples import FLEET, apply_patch, container, decoded_patch, pod
from tests.unit.webhook.webhook_samples import request as review_request


def workload(podsets: list[dict[str, Any]], assigned: dict[str, int] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if assigned:
        status["admission"] = {"podSetAssignments": [{"name": n, "count": c} for n, c in assigned.items()]}
    return {"metadata": {"name": "w", "namespace": "team-a"}, "spec": {"podSets": podsets}, "status": status}


def job_podset(
    count: int, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": "main",
        "count": count,
        "template": {
            "metadata": {"annotations": annotations or {}},
            "spec": {"containers": [{"name": "train", "resources": {"limits": limits}}]},
        },
    }


def test_a_jobs_template_is_read_as_the_webhook_reads_its_pods() -> None:
    annotations = {"nvidia.com/use-gputype": "A100"}
    groups = pod_groups(
        workload([job_podset(4, {"nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "30"}, annotations)]),
        {},
        [],
    )
    choice = Choice(memory=20 * GiB, cores=30, selection=selection_for(annotations))
    assert groups == [PodGroup("main", 4, (Request(1, (choice,)),))]


def test_partial_admission_counts_the_admitted_pods() -> None:
    groups = pod_groups(workload([job_podset(8, {"nvidia.com/gpumem": "1024"})], {"main": 3}), {}, [])
    assert groups[0].count == 3


def test_a_template_without_gpu_resources_asks_for_no_share() -> None:
    groups = pod_groups(workload([job_podset(2, {"cpu": "1"})]), {}, [])
    assert groups == [PodGroup("main", 2, ())]


def test_a_request_the_webhook_would_deny_is_refused_with_its_sentence() -> None:
    with pytest.raises(Refusal, match="gpucores is 300"):
        pod_groups(workload([job_podset(1, {"nvidia.com/gpucores": "300"})]), {}, [])


def test_a_plain_pod_whose_template_is_not_known_yet_is_undecidable() -> None:
    podset = {
        "name": "main",
        "count": 1,
        "template": {
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tessera-abc"}],
                "containers": [{"name": "c"}],
            }
        },
    }
    with pytest.raises(Undecidable):
        pod_groups(workload([podset]), {}, [])
    template = {
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.tessera.dev",
                                "count": 1,
                                "capacity": {"requests": {"memory": "4Gi"}},
                            },
                        }
                    ]
                }
            }
        }
    }
    groups = pod_groups(workload([podset]), {("team-a", "tessera-abc"): template}, [])
    assert groups == [PodGroup("main", 1, (Request(1, (Choice(memory=4 * GiB),)),))]


def test_other_device_classes_and_foreign_selectors_are_not_ours_to_judge() -> None:
    spec = {
        "devices": {
            "requests": [
                {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.tessera.dev",
                        "selectors": [{"cel": {"expression": "device.attributes['x'].y"}}],
                        "capacity": {"requests": {"memory": "1Gi"}},
                    },
                },
            ]
        }
    }
    unknown: list[str] = []
    assert requests_from_claim_spec(spec, unknown) == [
        Request(1, (Choice(memory=GiB, selection=Selection()),))
    ]
    assert unknown == ["device.attributes['x'].y"]


# -- what the webhook writes, the admission check reads ---------------------------------------------

A100_NOT_BAD = {"nvidia.com/use-gputype": "A100,H100", "nvidia.com/nouse-gpuuuid": "GPU-bad"}


def converted_podset(limits: dict[str, str], annotations: dict[str, str]) -> tuple[dict[str, Any], Any]:
    """The PodSet of a plain pod the webhook converted, and the templates it wrote, keyed as the
    inventory keys them in the Workload's namespace: the webhook's own code from pod to patch to templates."""
    original = pod(container("main", limits), annotations=annotations)
    decision = admit(review_request(original), FLEET)  # type: ignore[arg-type]
    assert decision.outcome == "converted", decision.response
    patched = apply_patch(original, decoded_patch(decision.response))
    templates = {("team-a", t["metadata"]["name"]): t for t in decision.templates}
    podset = {
        "name": "main",
        "count": 1,
        "template": {"metadata": patched["metadata"], "spec": patched["spec"]},
    }
    return podset, templates


@pytest.mark.parametrize(
    ("limits", "annotations", "expected"),
    [
        ({"nvidia.com/gpumem": "8192"}, {}, Request(1, (Choice(memory=8 * GiB),))),
        ({"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1024"}, {}, Request(3, (Choice(memory=GiB),))),
        (
            {"nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "25"},
            {},
            Request(1, (Choice(2 * GiB, cores=25),)),
        ),
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "10"},
            {},
            Request(
                2,
                (
                    Choice(20 * GiB, cores=10, memory_size=80 * GiB),
                    Choice(10 * GiB, cores=10, memory_size=40 * GiB),
                ),
            ),
        ),
        (
            {"nvidia.com/gpucores": "50"},
            {},
            Request(
                1,
                (
                    Choice(80 * GiB, cores=50, memory_size=80 * GiB),
                    Choice(40 * GiB, cores=50, memory_size=40 * GiB),
                ),
            ),
        ),
        (
            {"nvidia.com/gpumem": "4096"},
            {"nvidia.com/use-gpuuuid": "GPU-a, GPU-b"},
            Request(1, (Choice(4 * GiB, selection=Selection(use_uuids=("GPU-a", "GPU-b"))),)),
        ),
        (
            {"nvidia.com/gpumem": "4096"},
            A100_NOT_BAD,
            Request(
                1,
                (Choice(4 * GiB, selection=Selection(nouse_uuids=("GPU-bad",), use_types=("a100", "h100"))),),
            ),
        ),
        (
            {"nvidia.com/gpumem-percentage": "50"},
            {"nvidia.com/nouse-gputype": "T4"},
            Request(
                1,
                (
                    Choice(40 * GiB, selection=Selection(nouse_types=("t4",)), memory_size=80 * GiB),
                    Choice(20 * GiB, selection=Selection(nouse_types=("t4",)), memory_size=40 * GiB),
                ),
            ),
        ),
    ],
    ids=[
        "memory",
        "count",
        "cores",
        "percentage-count-cores",
        "cores-only",
        "uuids",
        "types-and-exclusion",
        "type-exclusion",
    ],
)
def test_every_request_shape_the_webhook_writes_reads_back_as_the_request_it_was_made_from(
    limits: dict[str, str], annotations: dict[str, str], expected: Request
) -> None:
    podset, templates = converted_podset(limits, annotations)
    unknown: list[str] = []
    assert pod_groups(workload([podset]), templates, unknown) == [PodGroup("main", 1, (expected,))]
    assert unknown == [], "the webhook's own selectors are judged, from its record"


def test_a_converted_pod_reads_as_its_job_template_did_before_conversion() -> None:
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "40"}
    podset, templates = converted_podset(limits, A100_NOT_BAD)
    before = pod_groups(workload([job_podset(1, limits, A100_NOT_BAD)]), {}, [])
    assert pod_groups(workload([podset]), templates, []) == before


def recorded_template(limits: dict[str, str]) -> dict[str, Any]:
    _, templates = converted_podset(limits, {})
    (template,) = templates.values()
    return copy.deepcopy(template)


def test_a_template_whose_record_and_spec_disagree_is_not_read_but_refused_with_a_reason() -> None:
    template = recorded_template({"nvidia.com/gpumem": "1024"})
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "80Gi"
    with pytest.raises(RecordError, match="asks for other GPU shares than its annotation"):
        requests_from_claim_template("team/t", template, [])


def test_an_unreadable_record_is_refused_with_the_readers_sentence() -> None:
    template = recorded_template({"nvidia.com/gpumem": "1024"})
    template["spec"]["metadata"]["annotations"][GPU_REQUEST_ANNOTATION] = '{"version": 9}'
    with pytest.raises(RecordError, match='has version "9"; this Tessera reads version 1'):
        requests_from_claim_template("team/t", template, [])


def test_a_hand_written_copy_of_the_webhooks_cel_without_its_record_is_read_by_its_structure() -> None:
    """Without the record nothing says the CEL is Tessera's: every selector is named as not judged
    here, and the size comes from the capacity, as for any template a user wrote."""
    template = recorded_template({"nvidia.com/gpumem-percentage": "50"})
    del template["spec"]["metadata"]
    unknown: list[str] = []
    (request,) = requests_from_claim_template("team/t", template, unknown)
    assert request == Request(1, (Choice(memory=40 * GiB), Choice(memory=20 * GiB)))
    assert len(unknown) == 2 and all("compareTo" in expression for expression in unknown)


EXTRA = 'device.attributes["gpu.tessera.dev"].index == 3'


def test_a_record_beside_a_selector_it_does_not_imply_is_not_trusted_and_the_selector_is_named() -> None:
    """The webhook's own template plus one CEL selector written by hand: the record says "any GPU"
    but the scheduler will also apply the extra selector, so the template is read by its structure
    and the extra selector is named as not judged."""
    template = recorded_template({"nvidia.com/gpumem": "1024"})
    body = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    body["selectors"] = [{"cel": {"expression": EXTRA}}]
    unknown: list[str] = []
    (request,) = requests_from_claim_template("team/t", template, unknown)
    assert request == Request(1, (Choice(memory=1024 * MiB),))
    assert unknown == [EXTRA]


def test_a_record_whose_template_lacks_the_webhooks_label_is_not_trusted() -> None:
    """The webhook's template for an A100-only share, its selection judged from the record; the
    same template without the webhook's label is read by its structure, its selector named."""
    _, templates = converted_podset({"nvidia.com/gpumem": "1024"}, {"nvidia.com/use-gputype": "A100"})
    (template,) = copy.deepcopy(list(templates.values()))
    judged: list[str] = []
    (trusted,) = requests_from_claim_template("team/t", template, judged)
    assert judged == [] and trusted.choices[0].selection == Selection(use_types=("a100",))

    del template["metadata"]["labels"]
    unknown: list[str] = []
    (request,) = requests_from_claim_template("team/t", template, unknown)
    assert request == Request(1, (Choice(memory=1024 * MiB),))
    assert unknown == selection_cel(Selection(use_types=("a100",)))


def test_a_percentage_records_size_selectors_are_implied_and_one_more_is_not() -> None:
    template = recorded_template({"nvidia.com/gpumem-percentage": "50"})
    unknown: list[str] = []
    requests_from_claim_template("team/t", template, unknown)
    assert unknown == []
    template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][1]["selectors"].append(
        {"cel": {"expression": EXTRA}}
    )
    (request,) = requests_from_claim_template("team/t", template, unknown)
    assert request == Request(1, (Choice(memory=40 * GiB), Choice(memory=20 * GiB)))
    assert EXTRA in unknown
