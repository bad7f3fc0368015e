"""A GPU request to the ResourceClaimTemplate the webhook writes: the claim spec the scheduler reads
and the request recorded beside it."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.driver.devices import device
from tessera.gpu_request import GpuRequest, Refusal, Selection, request_from_annotation
from tessera.names import DRIVER_NAME, GPU_REQUEST_ANNOTATION
from tessera.quantity import GiB, MiB
from tessera.selection_cel import selection_cel, size_selector
from tessera.webhook.conversion import (
    DISTINCT_GPU_ATTRIBUTE,
    claim_template,
    converted,
    template_name,
)
from tessera.webhook.conversion import claim_spec as spec_of_converted
from tessera.webhook.fleet import Fleet
from tests.unit.driver.driver_samples import gpu
from tests.unit.webhook.webhook_samples import FLEET

A100 = Selection(use_types=("a100",))
(SEL,) = selection_cel(A100)


def claim_spec(request: GpuRequest, fleet: Fleet = FLEET) -> dict[str, Any]:
    """The claim spec the webhook writes for ``request`` on ``fleet``."""
    return spec_of_converted(converted('container "c"', request, fleet))


def test_absolute_gpumem_becomes_one_request_with_memory_and_cores_per_gpu() -> None:
    spec = claim_spec(GpuRequest(2, 8000 * MiB, None, 30, A100))
    assert spec == {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.tessera.dev",
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "selectors": [{"cel": {"expression": SEL}}],
                        "capacity": {"requests": {"memory": "8000Mi", "cores": "30"}},
                    },
                }
            ],
            # nvidia.com/gpu: 2 is two GPUs, as in HAMi, not two shares of one.
            "constraints": [{"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/uuid"}],
        }
    }


def test_one_gpu_needs_no_distinct_constraint() -> None:
    spec = claim_spec(GpuRequest(1, 8000 * MiB, None, 30))
    assert "constraints" not in spec["devices"]
    spec = claim_spec(GpuRequest(1, None, 50, None))
    assert "constraints" not in spec["devices"]


def test_a_percentage_for_several_gpus_keeps_them_distinct_whichever_subrequest_is_taken() -> None:
    spec = claim_spec(GpuRequest(3, None, 50, 20))
    [request] = spec["devices"]["requests"]
    assert [c["count"] for c in request["firstAvailable"]] == [3, 3]
    # Named by the parent request, the constraint covers all of its subrequests.
    assert spec["devices"]["constraints"] == [
        {"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/uuid"}
    ]


def test_the_distinct_attribute_is_the_uuid_the_driver_publishes() -> None:
    domain, name = DISTINCT_GPU_ATTRIBUTE.split("/")
    assert domain == DRIVER_NAME
    assert name in device(gpu())["attributes"]


def test_uncapped_request_names_no_cores() -> None:
    spec = claim_spec(GpuRequest(1, 100 * MiB, None, None))
    exactly = spec["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"]["requests"] == {"memory": "100Mi"}
    assert "selectors" not in exactly


def test_percentage_gives_each_gpu_size_its_own_subrequest_with_an_absolute_share() -> None:
    spec = claim_spec(GpuRequest(1, None, 50, 20, A100))
    [request] = spec["devices"]["requests"]
    choices = request["firstAvailable"]
    assert [c["name"] for c in choices] == ["m81920mi", "m40960mi"]
    assert [c["capacity"]["requests"] for c in choices] == [
        {"memory": "40960Mi", "cores": "20"},
        {"memory": "20480Mi", "cores": "20"},
    ]
    assert [c["selectors"][0]["cel"]["expression"] for c in choices] == [
        size_selector(80 * GiB),
        size_selector(40 * GiB),
    ]
    assert all(c["selectors"][1] == {"cel": {"expression": SEL}} for c in choices)


def test_percentage_shares_round_down_to_whole_mebibytes() -> None:
    odd = Fleet(memory_sizes=(15 * GiB + 3 * MiB,), max_gpus_per_node=1)
    spec = claim_spec(GpuRequest(1, None, 33, None), odd)
    share = spec["devices"]["requests"][0]["firstAvailable"][0]["capacity"]["requests"]["memory"]
    assert share == f"{((15 * GiB + 3 * MiB) * 33 // 100) // MiB}Mi"


def test_percentage_is_refused_when_no_gpu_is_published_or_there_are_too_many_sizes() -> None:
    with pytest.raises(Refusal, match=r"no gpu\.tessera\.dev GPU is published"):
        claim_spec(GpuRequest(1, None, 50, None), Fleet())
    many = Fleet(memory_sizes=tuple(GiB * n for n in range(20, 11, -1)), max_gpus_per_node=1)
    with pytest.raises(Refusal, match="9 sizes, more than DRA's 8"):
        claim_spec(GpuRequest(1, None, 50, None), many)


def test_identical_shapes_share_a_template_name_and_different_shapes_do_not() -> None:
    a = claim_template("team", 'container "c"', GpuRequest(1, 8000 * MiB, None, 30), FLEET)
    b = claim_template("team", 'container "other"', GpuRequest(1, 8000 * MiB, None, 30), FLEET)
    c = claim_template("team", 'container "c"', GpuRequest(1, 8000 * MiB, None, 31), FLEET)
    assert a == b and a["metadata"]["name"] != c["metadata"]["name"]
    assert a["metadata"]["name"] == template_name(a["spec"])
    assert a["metadata"]["namespace"] == "team"
    assert a["spec"]["spec"] == claim_spec(GpuRequest(1, 8000 * MiB, None, 30))


def test_the_template_records_the_converted_request_in_its_claim_metadata() -> None:
    """kube-controller-manager copies the template's claim metadata onto every claim it makes: the
    record reaches the claims too. A percentage is recorded with the sizes its choices are for."""
    request = GpuRequest(2, None, 50, 20, A100)
    template = claim_template("team", 'container "c"', request, FLEET)
    recorded = request_from_annotation(template["spec"]["metadata"]["annotations"][GPU_REQUEST_ANNOTATION])
    assert recorded == GpuRequest(2, None, 50, 20, A100, (80 * GiB, 40 * GiB))
    assert template["spec"]["spec"] == spec_of_converted(recorded)


def test_a_percentage_no_gpu_gives_a_mebibyte_of_is_refused() -> None:
    tiny = Fleet(memory_sizes=(MiB,), max_gpus_per_node=1)
    with pytest.raises(Refusal, match="less than 1 MiB of every published GPU"):
        claim_spec(GpuRequest(1, None, 50, None), tiny)
