"""The packing: shares fit only when every one has a GPU at once, one node per pod; a sum that fits
is not enough."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.admissioncheck.fit import (
    Choice,
    PodGroup,
    Request,
    _too_few_slots,
    apply,
    describe_need,
    first_fit,
    forget,
    format_bytes,
    free_capacity,
    no_fit_message,
    pack,
)
from tessera.gpu_request import Selection
from tessera.quantity import GiB
from tessera.slices import PublishedGpu


def gpus_on(node: str, *memories_gi: int, product: str = "NVIDIA A100") -> list[PublishedGpu]:
    return [
        PublishedGpu(node, node, f"gpu-{i}", f"GPU-{node}-{i}", product, m * GiB, 100)
        for i, m in enumerate(memories_gi)
    ]


def pods(name: str, count: int, *shares: tuple[int, int], per_request: int = 1) -> PodGroup:
    """``count`` pods, each with one request per (memory Gi, cores) share."""
    requests = tuple(Request(per_request, (Choice(memory=m * GiB, cores=c),)) for m, c in shares)
    return PodGroup(name, count, requests)


def all_free(gpus: list[PublishedGpu]) -> dict[tuple[str, str], tuple[int, int]]:
    return free_capacity(gpus, {})


def used_by(gpus: list[PublishedGpu], free_gi: dict[str, int]) -> dict[tuple[str, str], tuple[int, int]]:
    """Free state where the GPU named node/gpu-i has only free_gi[...] Gi left."""
    used = {}
    for gpu in gpus:
        label = f"{gpu.node}/{gpu.name}"
        if label in free_gi:
            used[gpu.key] = (gpu.memory - free_gi[label] * GiB, 0)
    return free_capacity(gpus, used)


def test_a_gang_of_four_20gi_pods_does_not_fit_on_gpus_with_12gi_free_though_the_sum_does() -> None:
    gpus = gpus_on("node-a", 24, 24, 24, 24) + gpus_on("node-b", 24, 24, 24, 24)
    free = used_by(gpus, {f"{n}/gpu-{i}": 12 for n in ("node-a", "node-b") for i in range(4)})
    assert sum(m for m, _ in free.values()) >= 4 * 20 * GiB  # the arithmetic says yes
    gang = [pods("workers", 4, (20, 30))]
    result = pack(gang, gpus, free)
    assert not result.fits and not result.exhausted
    message = no_fit_message(gang, gpus, free, result.exhausted)
    assert message.startswith(
        "needs 4 shares of 20Gi/30 at once; the largest free share is 12Gi/100 on node-"
    )


def test_the_gang_fits_once_two_gpus_free_up_and_each_pod_has_a_gpu_of_its_own() -> None:
    gpus = gpus_on("node-a", 40, 40, 24, 24)
    free = used_by(gpus, {"node-a/gpu-2": 12, "node-a/gpu-3": 12})
    result = pack([pods("workers", 4, (20, 30))], gpus, free)
    assert result.fits and result.placements is not None
    assert len(result.placements) == 4
    assert {share[0][1] for p in result.placements for share in [p.shares[0]]} == {"gpu-0", "gpu-1"}


def test_two_15gi_shares_do_not_fit_on_a_20gi_and_a_10gi_gpu() -> None:
    gpus = gpus_on("node-a", 20, 10)
    assert not pack([pods("p", 2, (15, 0))], gpus, all_free(gpus)).fits


def test_bin_packing_that_first_fit_by_arrival_would_miss_is_found() -> None:
    # Pieces 6,5,4,3,3,3 (24) on two GPUs of 12: first fit in arrival order 6+5 | 4+3+3 leaves a 3
    # over; the packing 6+3+3 | 5+4+3 exists.
    gpus = gpus_on("node-a", 12, 12)
    groups = [pods(f"p{i}", 1, (m, 0)) for i, m in enumerate((6, 5, 4, 3, 3, 3))]
    result = pack(groups, gpus, all_free(gpus))
    assert result.fits and result.placements is not None
    loads: dict[str, int] = {}
    for placement in result.placements:
        for key, memory, _ in placement.shares:
            loads[key[1]] = loads.get(key[1], 0) + memory
    assert sorted(loads.values()) == [12 * GiB, 12 * GiB]
    assert not result.whole_groups, "the scheduler's first fit would not reproduce it: not to be held"


def test_a_packing_that_needs_backtracking_over_best_fit_is_found() -> None:
    # Best fit puts 5 on the 6-GPU first; only 5->7-GPU, 6->6-GPU... the search must undo that.
    gpus = gpus_on("node-a", 6, 7)
    groups = [pods("a", 1, (5, 0)), pods("b", 1, (6, 0))]
    result = pack(groups, gpus, all_free(gpus))
    assert result.fits


def test_cores_are_packed_too_memory_alone_is_not_enough() -> None:
    gpus = gpus_on("node-a", 80, 80)
    assert pack([pods("p", 2, (10, 60))], gpus, all_free(gpus)).fits
    assert not pack([pods("p", 3, (10, 60))], gpus, all_free(gpus)).fits


def test_all_shares_of_one_pod_must_be_on_one_node() -> None:
    gpus = gpus_on("node-a", 16) + gpus_on("node-b", 16)
    # One pod with two 10Gi shares: 20Gi free in total, but no node has two GPUs with 10Gi.
    assert not pack([pods("p", 1, (10, 0), (10, 0))], gpus, all_free(gpus)).fits
    # Two pods of one share each fit, one per node.
    assert pack([pods("p", 2, (10, 0))], gpus, all_free(gpus)).fits


def test_two_shares_of_one_request_need_two_gpus_though_one_gpu_has_room_for_both() -> None:
    # nvidia.com/gpu: 2 is two GPUs: the scheduler gives a request's shares distinct devices.
    gpus = gpus_on("node-a", 40)
    group = [pods("p", 1, (15, 30), per_request=2)]
    result = pack(group, gpus, all_free(gpus))
    assert not result.fits and not result.exhausted
    assert no_fit_message(group, gpus, all_free(gpus), result.exhausted).startswith(
        "needs 2 shares of 15Gi/30 at once, a request's 2 shares on 2 different GPUs of one node; "
        "the largest free share is 40Gi/100 on node-a (gpu-0)"
    )
    # A second GPU without room for a share does not help either.
    gpus = gpus_on("node-a", 40, 40)
    assert not pack(group, gpus, used_by(gpus, {"node-a/gpu-1": 10})).fits
    # Nor does a second GPU with room on another node: a pod runs on one node.
    gpus = gpus_on("node-a", 40) + gpus_on("node-b", 40)
    assert not pack(group, gpus, all_free(gpus)).fits


def test_two_shares_of_one_request_fit_when_two_gpus_have_room_one_share_on_each() -> None:
    gpus = gpus_on("node-a", 40, 40)
    result = pack([pods("p", 1, (15, 30), per_request=2)], gpus, used_by(gpus, {"node-a/gpu-1": 20}))
    assert result.fits and result.placements is not None
    [placement] = result.placements
    assert sorted(key[1] for key, _, _ in placement.shares) == ["gpu-0", "gpu-1"]


def test_shares_of_different_requests_of_one_pod_may_share_a_gpu() -> None:
    # Two containers (two claims) of one pod, each one share: the scheduler may put both on one GPU.
    gpus = gpus_on("node-a", 40)
    result = pack([pods("p", 1, (15, 30), (15, 30))], gpus, all_free(gpus))
    assert result.fits and result.placements is not None
    assert {key for key, _, _ in result.placements[0].shares} == {("node-a", "gpu-0")}


def test_the_slot_count_gives_each_pod_one_place_per_gpu_for_a_request() -> None:
    gpus = gpus_on("node-a", 80)
    # Eight 10Gi places on the GPU, but one pod's two shares of one request need two GPUs.
    assert _too_few_slots([pods("p", 1, (10, 0), per_request=2)], gpus, all_free(gpus))
    # Two pods of three shares each on three GPUs: six places, one per pod per GPU.
    gpus = gpus_on("node-a", 80, 80, 80)
    assert not _too_few_slots([pods("p", 2, (10, 0), per_request=3)], gpus, all_free(gpus))
    # Two pods of two shares on an 80Gi GPU and one with 10Gi free: nine 10Gi places, but the big
    # GPU holds one share of each pod, so three places for four shares.
    two = gpus[:2]
    assert _too_few_slots([pods("p", 2, (10, 0), per_request=2)], two, used_by(two, {"node-a/gpu-1": 10}))
    assert not _too_few_slots([pods("p", 2, (10, 0), per_request=2)], two, used_by(two, {"node-a/gpu-1": 20}))
    # The places of one request must be on one node.
    gpus = gpus_on("node-a", 80) + gpus_on("node-b", 80)
    assert _too_few_slots([pods("p", 1, (10, 0), per_request=2)], gpus, all_free(gpus))


def test_selectors_restrict_the_gpus_a_share_may_use() -> None:
    gpus = gpus_on("node-a", 40, product="NVIDIA A100") + gpus_on("node-b", 40, product="NVIDIA H100")
    only_h100 = Choice(memory=30 * GiB, selection=Selection(use_types=("h100",)))
    group = PodGroup("p", 2, (Request(1, (only_h100,)),))
    assert not pack([group], gpus, all_free(gpus)).fits
    placement = pack([PodGroup("p", 1, (Request(1, (only_h100,)),))], gpus, all_free(gpus)).placements
    assert placement is not None and placement[0].node == "node-b"
    not_this_uuid = Choice(memory=30 * GiB, selection=Selection(nouse_uuids=("GPU-node-b-0",)))
    placement = pack([PodGroup("p", 1, (Request(1, (not_this_uuid,)),))], gpus, all_free(gpus)).placements
    assert placement is not None and placement[0].node == "node-a"


def test_a_percentage_takes_its_share_of_each_gpus_own_memory() -> None:
    gpus = gpus_on("node-a", 80) + gpus_on("node-b", 40)
    half = Choice(memory_percent=50, cores=0)
    result = pack([PodGroup("p", 3, (Request(1, (half,)),))], gpus, all_free(gpus))
    assert result.fits and result.placements is not None
    memory = {g.key: g.memory for g in gpus}
    assert all(share[1] * 2 == memory[share[0]] for p in result.placements for share in p.shares)
    # Five halves do not fit on two GPUs.
    assert not pack([PodGroup("p", 5, (Request(1, (half,)),))], gpus, all_free(gpus)).fits


def test_first_available_uses_one_choice_for_all_shares_of_a_request() -> None:
    gpus = gpus_on("node-a", 80, 40)
    choices = (
        Choice(memory=60 * GiB, memory_size=80 * GiB),
        Choice(memory=30 * GiB, memory_size=40 * GiB),
    )
    # Two shares: both 60Gi on 80Gi GPUs cannot be, both 30Gi on 40Gi GPUs cannot be (one of each
    # size, and a request's shares go to different GPUs); mixing choices within a request is not
    # what the scheduler does, so it does not fit.
    assert not pack([PodGroup("p", 1, (Request(2, choices),))], gpus, all_free(gpus)).fits
    assert pack([PodGroup("p", 1, (Request(1, choices),))], gpus, all_free(gpus)).fits


def test_a_pod_group_goes_whole_to_one_node_when_one_holds_it_and_spreads_only_when_none_does() -> None:
    gpus = gpus_on("node-a", 80, 80) + gpus_on("node-b", 80, 80, 80, 80)
    free = used_by(gpus, {"node-a/gpu-0": 30, "node-a/gpu-1": 30})
    whole = pack([pods("main", 3, (30, 0))], gpus, free)
    assert whole.placements is not None
    assert {p.node for p in whole.placements} == {"node-b"}, "best fit alone would put two on node-a"
    assert whole.whole_groups
    crowded = used_by(
        gpus, {"node-a/gpu-0": 30, "node-a/gpu-1": 30, **{f"node-b/gpu-{i}": 0 for i in range(1, 4)}}
    )
    spread = pack([pods("main", 3, (30, 0))], gpus, crowded)
    assert spread.placements is not None
    assert sorted(p.node for p in spread.placements) == ["node-a", "node-a", "node-b"]


def test_first_fit_places_pods_as_the_scheduler_does_first_gpu_with_room_in_slice_order() -> None:
    gpus = gpus_on("node-a", 80, 80, 80)
    free = used_by(gpus, {"node-a/gpu-0": 30})
    placed = first_fit(pods("main", 3, (40, 0)), gpus, free)
    assert placed is not None
    assert [p.shares[0][0] for p in placed] == [gpus[1].key, gpus[1].key, gpus[2].key]
    two_gpus = first_fit(pods("pair", 1, (50, 0), per_request=2), gpus, all_free(gpus))
    assert two_gpus is not None and [k for k, _, _ in two_gpus[0].shares] == [gpus[0].key, gpus[1].key]
    assert first_fit(pods("main", 4, (50, 0)), gpus, free) is None, "three GPUs hold two and a half"


def test_a_group_waits_for_the_one_node_that_holds_it_when_that_node_is_avoided() -> None:
    gpus = gpus_on("node-a", 80, 80) + gpus_on("node-b", 80)
    result = pack([pods("main", 2, (60, 0))], gpus, all_free(gpus), avoid=frozenset({"node-a"}))
    assert result.placements is None and result.waits_for == "node-a"
    elsewhere = pack([pods("main", 1, (60, 0))], gpus, all_free(gpus), avoid=frozenset({"node-a"}))
    assert elsewhere.placements is not None and {p.node for p in elsewhere.placements} == {"node-b"}


def test_a_pod_group_without_gpu_shares_always_fits() -> None:
    assert pack([PodGroup("cpu", 5, ())], [], {}).fits


def test_the_budget_stops_a_hopeless_search_and_says_so() -> None:
    # Ten nodes, each with a GPU of 20+i Gi and one of 30+i Gi: one pod of two ~20Gi shares per node.
    # Eleven pods that all differ: every count of places says yes, only the node rule says no, and
    # nothing prunes the 10! orders but the budget.
    gpus = [g for i in range(10) for g in gpus_on(f"node-{i}", 20 + i, 30 + i)]
    free = all_free(gpus)
    groups = [
        PodGroup(
            f"p{j}",
            1,
            (Request(1, (Choice(memory=20 * GiB + j * 2**20),)), Request(1, (Choice(memory=20 * GiB),))),
        )
        for j in range(11)
    ]
    result = pack(groups, gpus, free, budget=500)
    assert not result.fits and result.exhausted
    assert no_fit_message(groups, gpus, free, result.exhausted).endswith(
        "no packing was found within the search limit"
    )


def test_too_few_places_for_a_share_is_proved_without_a_long_search() -> None:
    # 20 GPUs that all differ, 21 pods of one 20Gi share: at most one per GPU.
    gpus = gpus_on("node-a", *range(20, 40))
    result = pack([pods("many", 21, (20, 0))], gpus, all_free(gpus), budget=100_000)
    assert not result.fits and not result.exhausted
    assert result.steps < 1000


def test_placements_applied_leave_no_gpu_below_zero() -> None:
    gpus = gpus_on("node-a", 24, 24) + gpus_on("node-b", 24)
    groups = [pods("a", 2, (12, 50)), pods("b", 3, (8, 10))]
    result = pack(groups, gpus, all_free(gpus))
    assert result.placements is not None
    after = apply(all_free(gpus), result.placements)
    assert all(m >= 0 and c >= 0 for m, c in after.values())


def test_the_need_is_described_per_share_shape() -> None:
    groups = [pods("w", 4, (20, 30)), pods("ps", 1, (8, 0))]
    assert describe_need(groups) == "4 shares of 20Gi/30, 1 share of 8Gi"


def brute_force_fits(sizes: list[int], capacities: list[int]) -> bool:
    """Single-node, single-share pods: try every assignment."""
    for assignment in itertools.product(range(len(capacities)), repeat=len(sizes)):
        load = [0] * len(capacities)
        for size, gpu in zip(sizes, assignment, strict=True):
            load[gpu] += size
        if all(load[i] <= capacities[i] for i in range(len(capacities))):
            return True
    return False


def brute_force_fits_distinct(pod_shares: list[tuple[int, int]], capacities: list[int]) -> bool:
    """Single-node pods of one request each, (share size, count): every share on a GPU, a pod's
    shares on different GPUs."""
    shares = [(p, size) for p, (size, count) in enumerate(pod_shares) for _ in range(count)]
    for assignment in itertools.product(range(len(capacities)), repeat=len(shares)):
        load = [0] * len(capacities)
        used: set[tuple[int, int]] = set()
        for (pod, size), gpu in zip(shares, assignment, strict=True):
            if (pod, gpu) in used:
                break
            used.add((pod, gpu))
            load[gpu] += size
        else:
            if all(load[i] <= capacities[i] for i in range(len(capacities))):
                return True
    return False


@settings(max_examples=100, deadline=None)
@given(
    pod_shares=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 3)), min_size=1, max_size=3),
    capacities=st.lists(st.integers(1, 16), min_size=1, max_size=3),
)
def test_the_search_agrees_with_brute_force_on_requests_of_several_shares(
    pod_shares: list[tuple[int, int]], capacities: list[int]
) -> None:
    gpus = gpus_on("node-a", *capacities)
    groups = [pods(f"p{i}", 1, (s, 0), per_request=n) for i, (s, n) in enumerate(pod_shares)]
    result = pack(groups, gpus, all_free(gpus))
    assert not result.exhausted
    assert result.fits == brute_force_fits_distinct(pod_shares, capacities)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    capacities=st.lists(st.integers(1, 16), min_size=1, max_size=3),
)
def test_the_search_agrees_with_brute_force_on_small_cases(sizes: list[int], capacities: list[int]) -> None:
    gpus = gpus_on("node-a", *capacities)
    groups = [pods(f"p{i}", 1, (s, 0)) for i, s in enumerate(sizes)]
    result = pack(groups, gpus, all_free(gpus))
    assert not result.exhausted
    assert result.fits == brute_force_fits(sizes, capacities)


def test_a_summary_cache_kept_across_searches_changes_no_answer() -> None:
    gpus = [g for n in range(6) for g in gpus_on(f"node-{n}", 24, 40, 80)]
    groups = [pods(f"w{i}", 1 + i % 3, (8 + 4 * (i % 5), 10 * (i % 4))) for i in range(25)]
    with_cache, without = all_free(gpus), all_free(gpus)
    cache: dict[bool, dict[str, object]] = {}
    for group in groups:
        cached = pack([group], gpus, with_cache, cache=cache)  # type: ignore[arg-type]
        plain = pack([group], gpus, without)
        assert cached.placements == plain.placements
        if cached.placements:
            with_cache, without = apply(with_cache, cached.placements), apply(without, plain.placements or [])
            forget(cache, {p.node for p in cached.placements})  # type: ignore[arg-type]


def test_sizes_are_written_as_a_user_writes_them() -> None:
    assert [format_bytes(v) for v in (0, 20 * GiB, 1536 * 2**20, 1000)] == ["0", "20Gi", "1536Mi", "1000"]
