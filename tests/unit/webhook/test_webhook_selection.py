"""The structured Selection behind the webhook's CEL: what it writes is what it reads back, and what
:meth:`Selection.matches` decides is what that CEL says."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.webhook.conversion import (
    GpuRequest,
    container_requests,
    size_from_selector,
    size_selector,
)
from tessera.webhook.selectors import Selection, selection_for, selection_from_cel, selectors_for

uuids = st.lists(st.from_regex(r"GPU-[a-f0-9]{1,8}", fullmatch=True), min_size=1, max_size=3).map(tuple)
types = st.lists(
    st.text(
        st.characters(categories=("L", "N", "P", "S", "Zs"), exclude_characters=","), min_size=1, max_size=6
    )
    .map(str.strip)
    .filter(bool)
    .map(str.lower),
    min_size=1,
    max_size=3,
).map(lambda t: tuple(dict.fromkeys(t)))


@given(
    use=st.none() | uuids,
    nouse=st.none() | uuids,
    use_types=st.none() | types,
    nouse_types=st.none() | types,
)
def test_the_cel_a_selection_writes_reads_back_as_the_same_selection(
    use: tuple[str, ...] | None,
    nouse: tuple[str, ...] | None,
    use_types: tuple[str, ...] | None,
    nouse_types: tuple[str, ...] | None,
) -> None:
    selection = Selection(
        use_uuids=tuple(dict.fromkeys(use)) if use else None,
        nouse_uuids=tuple(dict.fromkeys(nouse)) if nouse else None,
        use_types=use_types,
        nouse_types=nouse_types,
    )
    read, others = selection_from_cel(selection.cel())
    assert read == selection and others == []


def test_selectors_for_is_the_selections_cel() -> None:
    annotations = {"nvidia.com/use-gpuuuid": "GPU-a,GPU-b", "nvidia.com/nouse-gputype": "T4"}
    assert selectors_for(annotations) == selection_for(annotations).cel()


def test_expressions_of_other_forms_are_handed_back_unjudged() -> None:
    selection, others = selection_from_cel(['device.attributes["x"].y == 1'])
    assert selection == Selection() and others == ['device.attributes["x"].y == 1']


def test_matches_follows_each_annotation() -> None:
    selection = selection_for({"nvidia.com/use-gputype": "a100,h100", "nvidia.com/nouse-gpuuuid": "GPU-bad"})
    assert selection.matches("GPU-1", "NVIDIA A100-SXM4-80GB")
    assert not selection.matches("GPU-bad", "NVIDIA A100-SXM4-80GB")
    assert not selection.matches("GPU-1", "Tesla T4")


def test_a_size_selector_reads_back_its_size_and_nothing_else_does() -> None:
    assert size_from_selector(size_selector(42 * 2**30)) == 42 * 2**30
    assert (
        size_from_selector('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("1Gi")) == 0')
        is None
    )


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
        ("initContainers", 0, 'init container "init"', GpuRequest(1, 1000, None, None)),
        ("containers", 1, 'container "gpu"', GpuRequest(1, None, 100, 30)),
    ]
