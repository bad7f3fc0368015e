"""The bypass rule on fake readings: which processes of a claim are offenders, and when an offence
is due. The readings are built directly (what NVML and the usage region would say), so each case
states exactly the figures it is about."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.exporter.bypass import OVER_LIMIT, UNCHARGED, Episodes, Holding, Offence, Process, offences
from tessera.exporter.containers import ContainerRef
from tessera.exporter.reading import Placed
from tessera.quantity import GiB, MiB
from tessera.shim.format import ProcessUsage

GPU = "GPU-1"
MAIN = Placed(ContainerRef("ns", "p1", "main"), "pod-uid", "c" * 64)


def process(pid: int, held: int, ns_pid: int | None = None, start: int = 5000) -> Process:
    return Process(pid, start, pid - 1000 if ns_pid is None else ns_pid, "python3", MAIN, held)


def slot(ns_pid: int, charged: int, start: int = 5000) -> ProcessUsage:
    return ProcessUsage(ns_pid, start, {GPU: charged})


def holding(processes: Sequence[Process], slots: Sequence[ProcessUsage] | None, limit: int = GiB) -> Holding:
    return Holding("ns", "c1", "uid-1", GPU, limit, processes, slots)


def named(found: list[Offence]) -> dict[int, str]:
    return {o.process.pid: o.reason for o in found}


def test_processes_charged_for_what_they_hold_within_the_limit_are_no_offenders() -> None:
    h = holding(
        [process(1001, 600 * MiB), process(1002, 400 * MiB)], [slot(1, 600 * MiB), slot(2, 400 * MiB)]
    )
    assert offences([h], tolerance=0) == []


def test_a_process_the_region_charges_nothing_is_an_offender_even_under_the_claims_limit() -> None:
    """Memory around the shim: the driver counts 600 MiB for a process with no slot at all, while the
    claim as a whole stays under its 1 GiB limit."""
    h = holding([process(1001, 300 * MiB), process(1002, 600 * MiB)], [slot(1, 300 * MiB)])
    (found,) = offences([h], tolerance=64 * MiB)
    assert (found.reason, found.process.pid, found.held, found.allowed) == (UNCHARGED, 1002, 600 * MiB, 0)


def test_zeroed_counters_name_the_process_whose_charge_was_erased_and_spare_the_charged_one() -> None:
    """A process held the whole 1 GiB, its slot was zeroed, and a second process allocated 1 GiB
    again through the shim: the region charges the second one for what it holds, so only the first
    is named, and once it goes the claim is within its limit."""
    first, second = process(1001, GiB), process(1002, GiB)
    h = holding([first, second], [slot(1, 0), slot(2, GiB)])
    assert named(offences([h], tolerance=64 * MiB)) == {1001: UNCHARGED}


def test_the_tolerance_is_per_process_and_only_memory_past_it_counts() -> None:
    """On a real GPU each context's overhead is counted by the driver and not by the shim."""
    h = holding([process(1001, 500 * MiB + 64 * MiB)], [slot(1, 500 * MiB)])
    assert offences([h], tolerance=64 * MiB) == []
    h = holding([process(1001, 500 * MiB + 64 * MiB + 1)], [slot(1, 500 * MiB)])
    assert named(offences([h], tolerance=64 * MiB)) == {1001: UNCHARGED}


def test_a_claim_past_its_limit_with_every_byte_charged_loses_its_largest_processes_until_the_rest_fit() -> (
    None
):
    """Slots can be written by the claim's processes (a forged charge hides nothing from the
    limit): three processes charged for what they hold but 1.5 GiB together under a 1 GiB limit.
    The largest goes first, and only as many as needed."""
    ps = [process(1001, 700 * MiB), process(1002, 500 * MiB), process(1003, 300 * MiB)]
    h = holding(ps, [slot(1, 700 * MiB), slot(2, 500 * MiB), slot(3, 300 * MiB)])
    (found,) = offences([h], tolerance=0)
    assert (found.reason, found.process.pid, found.held, found.allowed) == (OVER_LIMIT, 1001, 1500 * MiB, GiB)


def test_over_the_limit_the_uncharged_go_first_and_charged_ones_only_if_still_needed() -> None:
    ps = [process(1001, 900 * MiB), process(1002, 800 * MiB), process(1003, 200 * MiB)]
    # 1002 is uncharged; removing it leaves 1.1 GiB against 1 GiB: 1001, the larger, goes too.
    h = holding(ps, [slot(1, 900 * MiB), slot(3, 200 * MiB)])
    assert named(offences([h], tolerance=0)) == {1002: UNCHARGED, 1001: OVER_LIMIT}
    # Within the limit once the uncharged one goes: the charged ones stay.
    ps = [process(1001, 500 * MiB), process(1002, 800 * MiB), process(1003, 200 * MiB)]
    h = holding(ps, [slot(1, 500 * MiB), slot(3, 200 * MiB)])
    assert named(offences([h], tolerance=0)) == {1002: UNCHARGED}


def test_a_region_that_cannot_be_read_charges_nothing() -> None:
    """The shim refuses to run without a readable region, so memory held under a broken one went
    around it; every process holding more than the tolerance is named."""
    h = holding([process(1001, 100 * MiB), process(1002, 10 * MiB)], None)
    assert named(offences([h], tolerance=64 * MiB)) == {1001: UNCHARGED}


def test_a_slot_is_a_processs_only_with_its_own_namespace_pid_and_start_time() -> None:
    """Two pods sharing a claim may both number a process 7: the start time tells their slots apart;
    a slot that recorded no start time (0) is matched by pid alone, and a process whose namespace
    pid is unknown matches no slot."""
    a = process(1001, 300 * MiB, ns_pid=7, start=100)
    b = process(2001, 300 * MiB, ns_pid=7, start=200)
    h = holding([a, b], [slot(7, 300 * MiB, start=100)])
    assert named(offences([h], tolerance=0)) == {2001: UNCHARGED}
    h = holding([a], [slot(7, 300 * MiB, start=0)])
    assert offences([h], tolerance=0) == []
    h = holding([Process(1001, 100, None, "python3", MAIN, 300 * MiB)], [slot(7, 300 * MiB)])
    assert named(offences([h], tolerance=0)) == {1001: UNCHARGED}


def test_an_offence_is_due_once_it_held_at_every_check_for_the_bound_and_once_per_episode() -> None:
    h = holding([process(1001, GiB)], [])
    (offence,) = offences([h], tolerance=0)
    episodes = Episodes(bound=2.0)
    assert episodes.due([offence], 10.0) == []
    assert episodes.due([offence], 11.5) == []
    assert episodes.due([offence], 12.0) == [(offence, 2.0)]
    episodes.acted(offence)
    assert episodes.due([offence], 12.5) == []
    # A check without it ends the episode: the next one starts its bound afresh.
    assert episodes.due([], 13.0) == []
    assert episodes.due([offence], 13.5) == []
    assert episodes.due([offence], 15.5) == [(offence, 2.0)]


def test_an_offence_that_lapses_for_one_check_starts_its_bound_again() -> None:
    """A transient gap (an allocation between the driver's count and the region's charge) is seen at
    one check, not at every check of the bound."""
    (offence,) = offences([holding([process(1001, GiB)], [])], tolerance=0)
    episodes = Episodes(bound=2.0)
    episodes.due([offence], 10.0)
    episodes.due([], 11.0)
    assert episodes.due([offence], 12.5) == []
    assert episodes.due([offence], 14.5) == [(offence, 2.0)]


def test_the_sentence_names_the_process_what_it_held_past_what_and_for_how_long() -> None:
    h = holding([process(1001, 3 * GiB)], [slot(1, 512 * MiB)])
    (offence,) = offences([h], tolerance=0)
    assert offence.sentence(2.34, "stopped") == (
        "Process 1001 (python3) of container main held 3072 MiB on GPU GPU-1, 2560 MiB past what "
        "claim ns/c1's usage region charges it (512 MiB), for 2.3 s: stopped."
    )
    ps = [process(1001, 700 * MiB), process(1002, 500 * MiB)]
    (offence,) = offences([holding(ps, [slot(1, 700 * MiB), slot(2, 500 * MiB)])], tolerance=0)
    assert offence.sentence(3.0, "reported only") == (
        "Process 1001 (python3) of container main held 700 MiB on GPU GPU-1, where claim ns/c1's "
        "processes held 1200 MiB, 176 MiB past its limit of 1024 MiB, for 3.0 s: reported only."
    )
