"""The decision pass: reserved shares keep their planned place while it has room, placed pods leave
the reservation, and a Workload's decision follows from what is free."""

from __future__ import annotations

from tessera.admissioncheck.fit import Choice, Placement, PodGroup, Request, free_capacity
from tessera.admissioncheck.inventory import PodRecord
from tessera.admissioncheck.planning import (
    Decision,
    PassState,
    decide,
    give_back,
    has_room,
    less_placed,
    less_reclaimable,
    replan,
    unreadable,
)
from tessera.admissioncheck.podsets import Undecidable
from tessera.admissioncheck.workload_status import PENDING, READY, REJECTED
from tessera.gpu_request import RecordError, Refusal
from tessera.quantity import GiB
from tessera.slices import PublishedGpu


def test_placed_pods_leave_the_reserved_shares() -> None:
    groups = [PodGroup("main", 4, (Request(1, (Choice(memory=GiB),)),))]
    placed = [PodRecord(str(i), "ns", frozenset(), True, False, ("c",), "") for i in range(3)]
    assert less_placed(groups, placed) == [PodGroup("main", 1, groups[0].requests)]
    assert less_placed(groups, [*placed, PodRecord("9", "ns", frozenset(), True, False, ("c",), "")]) == []


def test_pods_kueue_no_longer_needs_leave_the_reserved_shares_and_a_failed_pods_replacement_does_not() -> (
    None
):
    groups = [PodGroup("main", 4, (Request(1, (Choice(memory=GiB),)),))]
    running = [PodRecord(str(i), "ns", frozenset(), True, False, ("c",), "") for i in range(2)]
    two_succeeded = {"status": {"reclaimablePods": [{"name": "main", "count": 2}]}}
    assert less_placed(less_reclaimable(groups, two_succeeded), running) == [], (
        "two succeeded (reclaimable), two running: nothing left to place"
    )
    assert less_placed(less_reclaimable(groups, {"status": {}}), running) == [
        PodGroup("main", 2, groups[0].requests)
    ], "two failed and replaced: the replacements are reserved again"
    junk = {"status": {"reclaimablePods": [{"name": "main", "count": "x"}, {"name": "other", "count": 9}]}}
    assert less_reclaimable(groups, junk) == groups
    assert less_reclaimable(groups, {"status": {"reclaimablePods": [{"name": "main", "count": 7}]}}) == []


def test_a_kept_plan_must_still_have_room_and_giving_back_restores_it() -> None:
    free = {("p", "g0"): (10 * GiB, 100)}
    placement = Placement("main", "n", ((("p", "g0"), 6 * GiB, 10), (("p", "g0"), 6 * GiB, 10)))
    assert not has_room(free, placement), "two 6Gi shares on one GPU with 10Gi free"
    single = Placement("main", "n", ((("p", "g0"), 6 * GiB, 10),))
    assert has_room(free, single)
    assert give_back({("p", "g0"): (4 * GiB, 90)}, [single]) == free


def test_reserved_shares_keep_their_planned_place_move_when_it_is_taken_and_block_when_none_is_left() -> None:
    gpus = [PublishedGpu("n", "n", f"g{i}", f"U{i}", "A100", 40 * GiB, 100) for i in range(2)]
    group = PodGroup("main", 1, (Request(1, (Choice(memory=30 * GiB),)),))
    first, plans = replan({}, gpus, free_capacity(gpus, {}), {"w1": ("ns/w1", [group])}, 1000)
    (planned,) = plans["w1"]
    assert first.unplanned == []
    # The scheduler put someone else's 30Gi on the planned GPU: the reserved share moves to the other.
    taken = free_capacity(gpus, {planned.shares[0][0]: (30 * GiB, 0)})
    second, plans = replan(plans, gpus, taken, {"w1": ("ns/w1", [group])}, 1000)
    (moved,) = plans["w1"]
    assert moved.shares[0][0] != planned.shares[0][0] and second.unplanned == []
    # Both GPUs taken: the reserved share has no place, and the pass says whose.
    full = free_capacity(gpus, {g.key: (30 * GiB, 0) for g in gpus})
    third, plans = replan(plans, gpus, full, {"w1": ("ns/w1", [group])}, 1000)
    assert third.unplanned == ["ns/w1"]
    # A Workload no longer reserved leaves no plan behind.
    _, plans = replan(plans, gpus, free_capacity(gpus, {}), {}, 1000)
    assert plans == {}


def two_nodes_of_two_gpus(memory_gi: int) -> list[PublishedGpu]:
    return [
        PublishedGpu(node, node, f"{node}-g{i}", f"{node}-U{i}", "A100", memory_gi * GiB, 100)
        for node in "ab"
        for i in range(2)
    ]


def one_pod(memory_gi: int) -> PodGroup:
    return PodGroup("main", 1, (Request(1, (Choice(memory=memory_gi * GiB),)),))


def test_a_share_held_to_a_node_moves_only_within_that_node() -> None:
    gpus = two_nodes_of_two_gpus(40)
    reserved = {"w1": ("ns/w1", [one_pod(30)])}
    held = {"w1": {"main": "a"}}
    _, plans = replan({}, gpus, free_capacity(gpus, {}), reserved, 1000, held)
    (planned,) = plans["w1"]
    assert planned.node == "a"
    # Someone else's pod took the planned GPU: the share moves to node a's other GPU, not to b.
    taken = free_capacity(gpus, {planned.shares[0][0]: (30 * GiB, 0)})
    state, plans = replan(plans, gpus, taken, reserved, 1000, held)
    (moved,) = plans["w1"]
    assert moved.node == "a" and moved.shares[0][0] != planned.shares[0][0] and state.unplanned == []
    # Both of a's GPUs taken: b has room, but the pods can go only to a, so nothing is planned.
    a_full = free_capacity(gpus, {g.key: (30 * GiB, 0) for g in gpus if g.node == "a"})
    state, plans = replan(plans, gpus, a_full, reserved, 1000, held)
    assert state.unplanned == ["ns/w1"]
    # Not held, the same share goes to b.
    state, plans = replan({}, gpus, a_full, reserved, 1000)
    assert state.unplanned == [] and plans["w1"][0].node == "b"


def test_while_a_workloads_pods_arrive_its_node_takes_no_other_workload() -> None:
    """Two Workloads' pods arriving on one node together may be placed in another order than
    planned, and the scheduler's first fit then leaves a planned pod no room."""
    gpus = two_nodes_of_two_gpus(80)
    reserved = {"w1": ("ns/w1", [one_pod(60)])}
    held = {"w1": {"main": "a"}}
    state, _ = replan({}, gpus, free_capacity(gpus, {}), reserved, 1000, held, arriving={"w1"})
    assert state.awaited == {"a"}
    small = [one_pod(10)]
    ready = decide(small, [], state, 1000)
    assert ready.state == READY and {p.node for p in ready.placements} == {"b"}, "a is awaited; b is not"
    state.take(ready)
    waiting = decide(small, [], state, 1000)
    assert waiting.state == PENDING
    assert waiting.message.startswith("waiting: fits on a once the pods already admitted there are placed")
    # Its pods placed (no longer arriving), the node takes others again.
    state, _ = replan({}, gpus, free_capacity(gpus, {}), reserved, 1000, held, arriving=())
    assert state.awaited == set() and decide(small, [], state, 1000).state == READY


def test_a_workload_spread_across_nodes_waits_for_a_quiet_moment_and_holds_the_rest() -> None:
    gpus = [PublishedGpu(node, node, f"{node}-g0", f"{node}-U0", "A100", 80 * GiB, 100) for node in "abc"]
    wide = [PodGroup("main", 2, (Request(1, (Choice(memory=60 * GiB),)),))]
    quiet, _ = replan({}, gpus, free_capacity(gpus, {}), {}, 1000)
    ready = decide(wide, [], quiet, 1000)
    assert ready.state == READY and len({p.node for p in ready.placements}) == 2
    quiet.take(ready)
    assert quiet.awaited == {"a", "b", "c"}, "nothing holds a spread PodSet's pods to its plan"
    arriving = {"w1": ("ns/w1", [one_pod(20)])}
    busy, _ = replan({}, gpus, free_capacity(gpus, {}), arriving, 1000, {"w1": {"main": "a"}}, {"w1"})
    waiting = decide(wide, [], busy, 1000)
    assert waiting.state == PENDING and "nothing else is admitted meanwhile" in waiting.message
    small = [one_pod(10)]
    assert decide(small, [], busy, 1000).state == PENDING, "held behind the spread Workload"


def test_a_decision_says_where_it_fits_which_selectors_it_did_not_judge_or_why_it_waits() -> None:
    gpus = [PublishedGpu("n", "n", "g0", "U0", "A100", 40 * GiB, 100)]
    group = PodGroup("main", 1, (Request(1, (Choice(memory=30 * GiB),)),))
    state = PassState(gpus, free_capacity(gpus, {}), [])
    ready = decide([group], ["device.x"], state, 1000)
    assert (ready.state, ready.message) == (READY, "fits: 1 pod on n (selectors not judged here: device.x)")
    assert decide([PodGroup("main", 2, group.requests)], [], state, 1000).state == PENDING
    assert decide([PodGroup("main", 1, ())], [], state, 1000).message == "asks for no GPU"
    blocked = decide([group], [], PassState(gpus, state.free, ["ns/w0"]), 1000)
    assert blocked.state == PENDING and "(ns/w0)" in blocked.message


def test_a_workload_that_cannot_be_read_gets_an_explained_decision_never_a_silent_pass() -> None:
    assert unreadable(Refusal("c: too big.")) == Decision(
        REJECTED, "its GPU request can never be met: c: too big."
    )
    assert unreadable(Undecidable("template t not known")).state == PENDING
    record = unreadable(RecordError("annotation x is not JSON."))
    assert (record.state, record.message) == (
        REJECTED,
        "its GPU request cannot be read: annotation x is not JSON.",
    )
