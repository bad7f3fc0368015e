"""The HAMi inputs beyond the four resources, in detail: the MIG claim's exact shape, the share
configuration and its record, the fleet's answers about products, UUIDs and profiles, and the bounds
on what users write."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.admissioncheck.podsets import requests_from_claim_template
from tessera.gpu_request import (
    GpuRequest,
    MigRequest,
    RecordError,
    Refusal,
    Selection,
    read_mig,
    read_request,
    request_from_annotation,
    request_to_annotation,
)
from tessera.names import GPU_REQUEST_ANNOTATION
from tessera.quantity import GiB
from tessera.webhook.admission import admit
from tessera.webhook.conversion import claim_template, mig_claim_template
from tessera.webhook.fleet import Fleet, fleet_from_slices
from tessera.webhook.notices import MAX_WARNINGS, bounded
from tessera.webhook.policies import MAX_WARNING, policy_warnings
from tests.unit.webhook.test_webhook_hami_table import TABLE_FLEET
from tests.unit.webhook.webhook_samples import apply_patch, container, decoded_patch, pod, request

MIG_SPEC = {
    "devices": {
        "requests": [
            {
                "name": "mig",
                "exactly": {
                    "deviceClassName": "mig.tessera.dev",
                    "allocationMode": "ExactCount",
                    "count": 2,
                    "selectors": [
                        {"cel": {"expression": 'device.attributes["gpu.tessera.dev"].profile == "1g.10gb"'}}
                    ],
                },
            }
        ]
    }
}


def decide(obj: dict[str, Any], fleet: Fleet = TABLE_FLEET) -> Any:
    return admit(request(obj), fleet)  # type: ignore[arg-type]


def mig(limits: dict[str, Any]) -> MigRequest:
    found = read_mig("c", container(limits=limits))
    assert found is not None
    return found


def test_a_mig_resource_becomes_the_contracts_claim_and_leaves_the_pod() -> None:
    decision = decide(pod(container(limits={"nvidia.com/mig-1g.10gb": 2, "cpu": "1"})))
    (template,) = decision.templates
    assert template["spec"] == {"spec": MIG_SPEC}
    patched = apply_patch(
        pod(container(limits={"nvidia.com/mig-1g.10gb": 2, "cpu": "1"})), decoded_patch(decision.response)
    )
    main = patched["spec"]["containers"][0]
    assert main["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": "tessera-main"}]}
    assert patched["spec"]["resourceClaims"] == [
        {"name": "tessera-main", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]


def test_the_pods_selectors_apply_to_mig_instances_too() -> None:
    spec = mig_claim_template("team", mig({"nvidia.com/mig-1g.10gb": 1}), Selection(use_types=("h100",)))
    selectors = spec["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert len(selectors) == 2 and "lowerAscii().contains(t)" in selectors[1]["cel"]["expression"]


@pytest.mark.parametrize(
    ("limits", "phrase"),
    [
        ({'nvidia.com/mig-1g.10gb"||true': 1}, "does not name a MIG profile"),
        ({"nvidia.com/mig-" + "1" * 40: 1}, "does not name a MIG profile"),
        ({"nvidia.com/mig-1g.10gb": 0}, "it must be at least 1"),
        ({"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}, "ask one MIG profile"),
        ({"nvidia.com/mig-1g.10gb": 1, "nvidia.com/priority": 0}, "not both"),
    ],
    ids=["cel-quote", "too-long", "zero", "two-profiles", "with-priority"],
)
def test_malformed_mig_requests_are_refused(limits: dict[str, Any], phrase: str) -> None:
    with pytest.raises(Refusal, match=phrase):
        read_mig('container "c"', container(limits=limits))


@given(st.text(max_size=40))
def test_any_profile_is_refused_or_becomes_one_quoted_cel_string(profile: str) -> None:
    try:
        request = read_mig("c", container(limits={"nvidia.com/mig-" + profile: 1}))
    except Refusal:
        return
    assert request is not None
    expression = mig_claim_template("team", request, Selection())["spec"]["spec"]["devices"]["requests"][0][
        "exactly"
    ]["selectors"][0]["cel"]["expression"]
    assert expression == f'device.attributes["gpu.tessera.dev"].profile == "{profile}"'


def test_the_admission_check_counts_nothing_for_a_mig_template() -> None:
    template = mig_claim_template("team", mig({"nvidia.com/mig-1g.10gb": 1}), Selection())
    unknown: list[str] = []
    assert requests_from_claim_template("team/x", template, unknown) == []
    assert unknown == []


def share_template(limits: dict[str, Any], env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = container(limits=limits) if env is None else container(limits=limits, env=env)
    gpu = read_request('container "c"', body)
    assert gpu is not None
    return claim_template("team", "c", gpu, TABLE_FLEET)


def test_high_priority_travels_as_share_config_and_in_the_record() -> None:
    template = share_template({"nvidia.com/gpumem": 1000, "nvidia.com/priority": 0})
    devices = template["spec"]["spec"]["devices"]
    assert devices["config"] == [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": "gpu.tessera.dev",
                "parameters": {"apiVersion": "gpu.tessera.dev/v1", "kind": "ShareConfig", "priority": 0},
            },
        }
    ]
    record = template["spec"]["metadata"]["annotations"][GPU_REQUEST_ANNOTATION]
    assert '"priority":0' in record and request_from_annotation(record).priority == 0
    assert requests_from_claim_template("team/x", template, []) != []  # the check still reads it


def test_default_settings_write_no_config() -> None:
    for limits in ({"nvidia.com/gpumem": 1000}, {"nvidia.com/gpumem": 1000, "nvidia.com/priority": 1}):
        assert "config" not in share_template(limits)["spec"]["spec"]["devices"]
    assert share_template({"nvidia.com/gpumem": 1000}) == share_template(
        {"nvidia.com/gpumem": 1000, "nvidia.com/priority": "1"}
    )


def test_disable_control_takes_the_whole_gpu_without_enforcement() -> None:
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "True"}]
    template = share_template({"nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 20}, env)
    devices = template["spec"]["spec"]["devices"]
    (choice,) = devices["requests"][0]["firstAvailable"]
    assert choice["capacity"]["requests"] == {"memory": f"{80 * 1024}Mi", "cores": "100"}
    assert devices["config"][0]["opaque"]["parameters"]["enforcement"] == "off"
    assert "priority" not in devices["config"][0]["opaque"]["parameters"]
    record = request_from_annotation(template["spec"]["metadata"]["annotations"][GPU_REQUEST_ANNOTATION])
    assert not record.enforce and record.cores == 100


@pytest.mark.parametrize(
    "entry",
    [{"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}],
)
def test_a_disable_control_the_webhook_cannot_read_keeps_limits_and_says_so(entry: dict[str, Any]) -> None:
    decision = decide(pod(container(limits={"nvidia.com/gpumem": 1000}, env=[entry])))
    assert any("valueFrom" in warning for warning in decision.response["response"]["warnings"])
    (template,) = decision.templates
    assert "config" not in template["spec"]["spec"]["devices"]


def test_records_without_the_new_keys_read_as_before_and_bad_values_are_refused() -> None:
    old = '{"version":1,"count":1,"memory":1048576}'
    assert request_from_annotation(old) == GpuRequest(1, 1048576, None, None)
    for bad in ('"priority":2', '"priority":"0"', '"enforcement":"on"', '"enforcement":false'):
        with pytest.raises(RecordError):
            request_from_annotation(old[:-1] + "," + bad + "}")
    both = GpuRequest(1, None, 100, 100, priority=0, enforce=False)
    assert request_from_annotation(request_to_annotation(both)) == both


def mig_device(name: str, profile: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "uuid": {"string": "MIG-" + name},
        },
        "capacity": {"memory": {"value": "10Gi"}},
    }


def gpu_device(name: str, uuid: str, product: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": product},
        },
        "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}},
    }


def test_the_fleet_keeps_mig_instances_apart_from_shareable_gpus() -> None:
    slices = [
        {
            "metadata": {"name": "a"},
            "spec": {
                "driver": "gpu.tessera.dev",
                "nodeName": "a",
                "pool": {"name": "a"},
                "devices": [
                    gpu_device("gpu-0", "GPU-a", "NVIDIA H100 80GB HBM3"),
                    gpu_device("gpu-1", "GPU-b", "NVIDIA A100-SXM4-80GB"),
                    mig_device("mig-0", "1g.10gb"),
                    mig_device("mig-1", "3g.40gb"),
                ],
            },
        }
    ]
    fleet = fleet_from_slices(slices)
    assert (fleet.memory_sizes, fleet.max_gpus_per_node) == ((80 * GiB,), 2)
    assert fleet.mig_profiles == {"1g.10gb", "3g.40gb"}
    assert fleet.products == {"NVIDIA H100 80GB HBM3": 1, "NVIDIA A100-SXM4-80GB": 1}
    assert fleet.uuids == ("GPU-a", "GPU-b")
    assert fleet.has_match(Selection(use_types=("a100",)))
    assert not fleet.has_match(Selection(use_types=("a100",), nouse_uuids=("GPU-b",)))
    assert fleet.has_match(Selection(use_uuids=("GPU-x", "GPU-a")))
    assert not fleet.has_match(Selection(use_uuids=("GPU-a",), nouse_types=("h100",)))
    assert not fleet.has_match(Selection(use_uuids=("MIG-mig-0",)))


def test_a_selection_warning_names_a_few_of_many_uuids_within_bounds() -> None:
    uuids = {f"GPU-{i:04d}" + "x" * 60: "NVIDIA H100" for i in range(500)}
    fleet = Fleet(
        (80 * GiB,), 4, products={"NVIDIA H100": 500}, uuid_products=uuids, uuids=tuple(sorted(uuids))
    )
    obj = pod(container(limits={"nvidia.com/gpu": 1}), annotations={"nvidia.com/use-gpuuuid": "GPU-zzz"})
    (warning,) = decide(obj, fleet).response["response"]["warnings"]
    assert "and 498 more" in warning and len(warning) <= MAX_WARNING


def test_policy_values_are_read_within_bounds() -> None:
    many = ",".join(["spread"] * 100 + [f"p{i}" for i in range(100)])
    warnings = policy_warnings({"hami.io/gpu-scheduler-policy": many})
    assert len(warnings) == 8 and warnings[0].startswith("hami.io/gpu-scheduler-policy spread")
    assert all(len(w) <= MAX_WARNING for w in warnings)
    assert policy_warnings({"hami.io/gpu-scheduler-policy": " BinPack "}) == []
    (long,) = policy_warnings({"hami.io/node-scheduler-policy": "spread," * 400})
    assert long == "hami.io/node-scheduler-policy is longer than 2048 characters and is ignored."


def test_at_most_twelve_warnings_go_back_the_last_saying_how_many_were_left_out() -> None:
    out = bounded([f"w{i}" for i in range(20)])
    assert len(out) == MAX_WARNINGS and out[-1] == "9 more warnings were left out."
    assert bounded(["x" * 1000]) == ["x" * MAX_WARNING]


def test_warnings_are_not_given_for_a_pod_asking_no_gpu() -> None:
    obj = pod(
        container(), annotations={"hami.io/gpu-scheduler-policy": "spread", "nvidia.com/vgpu-mode": "mig"}
    )
    assert decide(obj).response["response"] == {"uid": request(obj)["uid"], "allowed": True}


def test_a_mig_container_needs_no_opt_out_but_hears_about_hami_core_variables() -> None:
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "5"}]
    decision = decide(pod(container(limits={"nvidia.com/mig-1g.10gb": 1}, env=env)))
    (warning,) = decision.response["response"]["warnings"]
    assert "CUDA_DEVICE_SM_LIMIT is HAMi-core's and is ignored" in warning


@pytest.mark.parametrize(
    "limits",
    [{"nvidia.com/gpumem": 4000}, {"nvidia.com/mig-1g.10gb": 1}],
    ids=["share", "mig"],
)
def test_a_pod_whose_selection_passes_the_apis_cel_bound_is_denied_with_the_sentence(
    limits: dict[str, Any],
) -> None:
    overlong = pod(container(limits=limits), annotations={"nvidia.com/use-gputype": "\U0001f600" * 2048})
    decision = decide(overlong)
    response = decision.response["response"]
    assert decision.outcome == "denied" and response["allowed"] is False
    assert response["status"]["message"] == (
        "annotation nvidia.com/use-gputype makes a GPU selector of 20569 characters, more than the "
        "10240 the API takes; list fewer entries or fewer characters outside plain ASCII."
    )
