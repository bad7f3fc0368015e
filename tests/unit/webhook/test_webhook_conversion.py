"""Reading HAMi resources (limits, else requests), the defaults, and the claim specs they become."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.driver.devices import device
from tessera.names import DRIVER_NAME
from tessera.quantity import GiB, MiB
from tessera.webhook.conversion import (
    DISTINCT_GPU_ATTRIBUTE,
    GpuRequest,
    Refusal,
    claim_spec,
    claim_template,
    read_request,
    size_selector,
    template_name,
)
from tessera.webhook.fleet import Fleet
from tests.unit.driver.driver_samples import gpu
from tests.unit.webhook.webhook_samples import FLEET

G, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)


def with_resources(
    limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "main", "resources": resources}


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({G: 1, MEM: 8000, CORES: 30}, None, GpuRequest(1, 8000, None, 30)),
        (None, {G: "2", MEM: "8000"}, GpuRequest(2, 8000, None, None)),
        ({G: 1}, {G: 1}, GpuRequest(1, None, 100, None)),
        ({MEM: 4096}, None, GpuRequest(1, 4096, None, None)),
        ({CORES: 50}, None, GpuRequest(1, None, 100, 50)),
        ({PCT: 50}, None, GpuRequest(1, None, 50, None)),
        ({G: 3, PCT: "25", CORES: "100"}, None, GpuRequest(3, None, 25, 100)),
        ({"cpu": "1", "memory": "1Gi"}, None, None),
        ({MEM: "1k"}, None, GpuRequest(1, 1000, None, None)),
        ({MEM: "1k"}, {MEM: 1000}, GpuRequest(1, 1000, None, None)),
    ],
    ids=[
        "gpumem-and-cores",
        "requests-only",
        "gpu-only-takes-all-memory-uncapped",
        "gpumem-only-means-one-gpu",
        "cores-only-means-one-gpu-all-memory",
        "percentage",
        "percentage-with-count",
        "no-gpu-resources",
        "suffix-quantity",
        "equal-quantities-spelled-differently",
    ],
)
def test_requests_are_read_with_the_documented_defaults(
    limits: dict[str, Any] | None, requests: dict[str, Any] | None, expected: GpuRequest | None
) -> None:
    assert read_request('container "main"', with_resources(limits, requests)) == expected


@pytest.mark.parametrize(
    ("limits", "requests", "phrase"),
    [
        ({G: "1.5"}, None, 'nvidia.com/gpu is "1.5", which is not a whole number'),
        ({MEM: "lots"}, None, 'nvidia.com/gpumem is refused: quantity "lots" is not a number'),
        ({MEM: "Infinity"}, None, 'nvidia.com/gpumem is refused: quantity "Infinity" is not a number'),
        ({MEM: "1e1000000"}, None, 'quantity "1e1000000" has an exponent past ±30'),
        ({MEM: "1" + "0" * 10_000}, None, "(10001 characters) is longer than 64 characters"),
        ({CORES: "1e4299"}, None, 'gpucores is refused: quantity "1e4299" has an exponent past ±30'),
        ({G: 0}, None, 'nvidia.com/gpu is "0"; it must be at least 1'),
        ({CORES: "-5"}, None, 'nvidia.com/gpucores is "-5"; it must be at least 1'),
        ({MEM: "500m"}, None, "not a whole number"),
        ({CORES: 101}, None, "nvidia.com/gpucores is 101; it must be between 1 and 100"),
        ({PCT: 0}, None, 'nvidia.com/gpumem-percentage is "0"; it must be at least 1'),
        ({PCT: 150}, None, "nvidia.com/gpumem-percentage is 150; it must be between 1 and 100"),
        ({MEM: 1000, PCT: 10}, None, "nvidia.com/gpumem and nvidia.com/gpumem-percentage are both given"),
        ({G: 1}, {G: 2}, 'nvidia.com/gpu has request "2" and limit "1"; they must be equal'),
    ],
)
def test_values_no_gpu_could_satisfy_are_refused_in_one_sentence_naming_container_and_resource(
    limits: dict[str, Any] | None, requests: dict[str, Any] | None, phrase: str
) -> None:
    with pytest.raises(Refusal) as refused:
        read_request('container "main"', with_resources(limits, requests))
    message = str(refused.value)
    assert message.startswith('container "main": ')
    assert phrase in message
    assert message.endswith(".") and message.count(". ") == 0
    assert len(message) < 160  # never the refused value echoed back whole


def test_absolute_gpumem_becomes_one_request_with_memory_and_cores_per_gpu() -> None:
    spec = claim_spec("c", GpuRequest(2, 8000, None, 30), ["sel"], FLEET)
    assert spec == {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.tessera.dev",
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "selectors": [{"cel": {"expression": "sel"}}],
                        "capacity": {"requests": {"memory": "8000Mi", "cores": "30"}},
                    },
                }
            ],
            # nvidia.com/gpu: 2 is two GPUs, as in HAMi, not two shares of one.
            "constraints": [{"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/uuid"}],
        }
    }


def test_one_gpu_needs_no_distinct_constraint() -> None:
    spec = claim_spec("c", GpuRequest(1, 8000, None, 30), [], FLEET)
    assert "constraints" not in spec["devices"]
    spec = claim_spec("c", GpuRequest(1, None, 50, None), [], FLEET)
    assert "constraints" not in spec["devices"]


def test_a_percentage_for_several_gpus_keeps_them_distinct_whichever_subrequest_is_taken() -> None:
    spec = claim_spec("c", GpuRequest(3, None, 50, 20), [], FLEET)
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
    spec = claim_spec("c", GpuRequest(1, 100, None, None), [], FLEET)
    exactly = spec["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"]["requests"] == {"memory": "100Mi"}
    assert "selectors" not in exactly


def test_percentage_gives_each_gpu_size_its_own_subrequest_with_an_absolute_share() -> None:
    spec = claim_spec("c", GpuRequest(1, None, 50, 20), ["sel"], FLEET)
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
    assert all(c["selectors"][1] == {"cel": {"expression": "sel"}} for c in choices)


def test_percentage_shares_round_down_to_whole_mebibytes() -> None:
    odd = Fleet(memory_sizes=(15 * GiB + 3 * MiB,), max_gpus_per_node=1)
    spec = claim_spec("c", GpuRequest(1, None, 33, None), [], odd)
    share = spec["devices"]["requests"][0]["firstAvailable"][0]["capacity"]["requests"]["memory"]
    assert share == f"{((15 * GiB + 3 * MiB) * 33 // 100) // MiB}Mi"


def test_percentage_is_refused_when_no_gpu_is_published_or_there_are_too_many_sizes() -> None:
    with pytest.raises(Refusal, match=r"no gpu\.tessera\.dev GPU is published"):
        claim_spec("c", GpuRequest(1, None, 50, None), [], Fleet())
    many = Fleet(memory_sizes=tuple(GiB * n for n in range(20, 11, -1)), max_gpus_per_node=1)
    with pytest.raises(Refusal, match="9 sizes, more than DRA's 8"):
        claim_spec("c", GpuRequest(1, None, 50, None), [], many)


def test_identical_shapes_share_a_template_name_and_different_shapes_do_not() -> None:
    a = claim_spec("c", GpuRequest(1, 8000, None, 30), [], FLEET)
    b = claim_spec("other container", GpuRequest(1, 8000, None, 30), [], FLEET)
    c = claim_spec("c", GpuRequest(1, 8000, None, 31), [], FLEET)
    assert template_name(a) == template_name(b) != template_name(c)
    assert template_name(a) == "tessera-" + template_name(a).removeprefix("tessera-")
    template = claim_template("team", a)
    assert template["metadata"]["name"] == template_name(a)
    assert template["metadata"]["namespace"] == "team"
    assert template["spec"] == {"spec": a}
