"""The one model of a GPU request: reading HAMi resources (limits, else requests) and annotations into
it with the documented defaults, and its annotation, which the webhook writes and the admission check
reads, with bounds and a strict schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.gpu_request import (
    MAX_RECORD_LENGTH,
    GpuRequest,
    RecordError,
    Refusal,
    Selection,
    container_requests,
    read_request,
    request_from_annotation,
    request_to_annotation,
    selection_for,
)
from tessera.names import GPU_REQUEST_ANNOTATION
from tessera.quantity import GiB, MiB

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
        ({G: 1, MEM: 8000, CORES: 30}, None, GpuRequest(1, 8000 * MiB, None, 30)),
        (None, {G: "2", MEM: "8000"}, GpuRequest(2, 8000 * MiB, None, None)),
        ({G: 1}, {G: 1}, GpuRequest(1, None, 100, None)),
        ({MEM: 4096}, None, GpuRequest(1, 4096 * MiB, None, None)),
        ({CORES: 50}, None, GpuRequest(1, None, 100, 50)),
        ({PCT: 50}, None, GpuRequest(1, None, 50, None)),
        ({G: 3, PCT: "25", CORES: "100"}, None, GpuRequest(3, None, 25, 100)),
        ({"cpu": "1", "memory": "1Gi"}, None, None),
        ({MEM: "1k"}, None, GpuRequest(1, 1000 * MiB, None, None)),
        ({MEM: "1k"}, {MEM: 1000}, GpuRequest(1, 1000 * MiB, None, None)),
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


def test_a_selection_read_with_the_request_goes_with_it() -> None:
    selection = Selection(use_types=("a100",))
    read = read_request('container "main"', with_resources({G: 1}), selection)
    assert read == GpuRequest(1, None, 100, None, selection)


def test_matches_follows_each_annotation() -> None:
    selection = selection_for({"nvidia.com/use-gputype": "a100,h100", "nvidia.com/nouse-gpuuuid": "GPU-bad"})
    assert selection.matches("GPU-1", "NVIDIA A100-SXM4-80GB")
    assert not selection.matches("GPU-bad", "NVIDIA A100-SXM4-80GB")
    assert not selection.matches("GPU-1", "Tesla T4")


def test_container_requests_yields_only_containers_that_ask_for_a_gpu() -> None:
    spec = {
        "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpumem": "1000"}}}],
        "containers": [
            {"name": "cpu"},
            {"name": "gpu", "resources": {"limits": {"nvidia.com/gpucores": "30"}}},
        ],
    }
    found = [(lst, i, where, req) for lst, i, _, where, req in container_requests(spec)]
    assert found == [
        ("initContainers", 0, 'init container "init"', GpuRequest(1, 1000 * MiB, None, None)),
        ("containers", 1, 'container "gpu"', GpuRequest(1, None, 100, 30)),
    ]


# -- the annotation --------------------------------------------------------------------------------

uuids = st.lists(st.from_regex(r"GPU-[a-f0-9]{1,8}", fullmatch=True), min_size=1, max_size=3, unique=True)
types = st.lists(
    st.text(st.characters(categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=6).map(str.lower),
    min_size=1,
    max_size=3,
    unique=True,
)
selections = st.builds(
    Selection,
    use_uuids=st.none() | uuids.map(tuple),
    nouse_uuids=st.none() | uuids.map(tuple),
    use_types=st.none() | types.map(tuple),
    nouse_types=st.none() | types.map(tuple),
)
absolute = st.builds(
    GpuRequest,
    count=st.integers(1, 16),
    memory=st.integers(1, 200 * 1024).map(lambda m: m * MiB),
    memory_percent=st.none(),
    cores=st.none() | st.integers(1, 100),
    selection=selections,
)
percentage = st.builds(
    GpuRequest,
    count=st.integers(1, 16),
    memory=st.none(),
    memory_percent=st.integers(1, 100),
    cores=st.none() | st.integers(1, 100),
    selection=selections,
    memory_sizes=st.lists(st.integers(1, 200).map(lambda g: g * GiB), max_size=8, unique=True).map(
        lambda sizes: tuple(sorted(sizes, reverse=True))
    ),
)


@given(absolute | percentage)
def test_every_request_reads_back_from_its_annotation_as_itself(request: GpuRequest) -> None:
    assert request_from_annotation(request_to_annotation(request)) == request


def test_the_annotation_is_versioned_json_with_only_what_is_set() -> None:
    request = GpuRequest(2, None, 50, 30, Selection(nouse_uuids=("GPU-x",)), (80 * GiB,))
    assert json.loads(request_to_annotation(request)) == {
        "version": 1,
        "count": 2,
        "memoryPercent": 50,
        "memorySizes": [80 * GiB],
        "cores": 30,
        "nouseUuids": ["GPU-x"],
    }


def test_a_request_outside_the_bounds_is_not_written() -> None:
    with pytest.raises(RecordError, match='count "2000", which is not a whole number from 1 to 1024'):
        request_to_annotation(GpuRequest(2000, 8 * GiB, None, None))


GOOD: dict[str, Any] = {"version": 1, "count": 1, "memory": 8 * GiB}


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ("x" * (MAX_RECORD_LENGTH + 1), f"is longer than {MAX_RECORD_LENGTH} characters"),
        ("{", "is not JSON"),
        ("[" * 60_000, "is not JSON"),
        ("[1]", "is not a JSON object"),
        (json.dumps({**GOOD, "version": 2}), 'has version "2"; this Tessera reads version 1'),
        (json.dumps({**GOOD, "version": True}), 'has version "True"'),
        (json.dumps({**GOOD, "extra": 1}), 'has the unknown field "extra"'),
        (json.dumps({"version": 1, "memory": GiB}), "has no count"),
        (json.dumps({**GOOD, "count": 0}), 'count "0", which is not a whole number from 1 to 1024'),
        (json.dumps({**GOOD, "count": 1.5}), 'count "1.5"'),
        (json.dumps({**GOOD, "count": "1"}), 'count "1"'),
        (json.dumps({**GOOD, "memoryPercent": 50}), "exactly one of memory and memoryPercent"),
        (json.dumps({"version": 1, "count": 1}), "exactly one of memory and memoryPercent"),
        (json.dumps({**GOOD, "cores": 101}), 'cores "101"'),
        (json.dumps({**GOOD, "memorySizes": [GiB]}), "memorySizes that are not 1 to 8 sizes"),
        (json.dumps({"version": 1, "count": 1, "memoryPercent": 5, "memorySizes": [0]}), 'memory size "0"'),
        (json.dumps({**GOOD, "useUuids": []}), "useUuids that is not a non-empty list"),
        (json.dumps({**GOOD, "useUuids": ['GPU-a" || true']}), "which is not a GPU UUID"),
        (json.dumps({**GOOD, "useTypes": ["A100"]}), "which is not a lower-case type"),
        (json.dumps({**GOOD, "nouseTypes": ["a", "a"]}), "nouseTypes with an entry twice"),
        (json.dumps({**GOOD, "nouseTypes": [7]}), "that is not a string of 1 to 2048 characters"),
    ],
)
def test_anything_but_a_version_1_record_within_bounds_is_refused_in_one_sentence(
    value: str, phrase: str
) -> None:
    with pytest.raises(RecordError) as refused:
        request_from_annotation(value)
    message = str(refused.value)
    assert message.startswith(f"annotation {GPU_REQUEST_ANNOTATION} ")
    assert phrase in message
    assert message.endswith(".") and len(message) < 200
