"""Connection slots shared between peers: a bound per peer, and when all are taken the largest
holder gives up its oldest, so a peer holding few connections is never starved by one holding many."""

from __future__ import annotations

import pytest

from tessera.peer_slots import PeerSlots, Taken


def test_a_peer_is_refused_past_its_own_bound_while_others_are_admitted() -> None:
    slots: PeerSlots[str] = PeerSlots(total=10, per_peer=2)
    assert slots.take("tenant", "a") == Taken(True)
    assert slots.take("tenant", "b") == Taken(True)
    assert slots.take("tenant", "c") == Taken(False)
    assert slots.take("apiserver", "d") == Taken(True)
    assert (len(slots), slots.held_by("tenant")) == (3, 2)


def test_when_all_are_taken_the_largest_holder_gives_up_its_oldest() -> None:
    slots: PeerSlots[str] = PeerSlots(total=4, per_peer=3)
    for key in ("t1", "t2", "t3"):
        slots.take("tenant", key)
    slots.take("other", "o1")
    assert slots.take("apiserver", "a1") == Taken(True, evicted="t1")
    assert slots.take("newcomer", "n1") == Taken(True, evicted="t2")
    assert slots.take("apiserver", "a2") == Taken(False)  # it would hold 2, no more than anyone
    assert [slots.held_by(peer) for peer in ("tenant", "other", "apiserver", "newcomer")] == [1, 1, 1, 1]


def test_a_newcomer_is_refused_rather_than_take_from_a_peer_holding_no_more_than_it_would() -> None:
    slots: PeerSlots[str] = PeerSlots(total=4, per_peer=4)
    for peer in ("a", "b", "c", "d"):
        slots.take(peer, peer + "1")
    assert slots.take("e", "e1") == Taken(False)  # every holder has 1, the newcomer would have 1
    assert slots.take("a", "a2") == Taken(False)


def test_release_frees_the_slot_and_is_harmless_for_an_evicted_key() -> None:
    slots: PeerSlots[str] = PeerSlots(total=2, per_peer=2)
    slots.take("tenant", "t1")
    slots.take("tenant", "t2")
    assert slots.take("apiserver", "a1") == Taken(True, evicted="t1")
    slots.release("tenant", "t1")  # its connection closing after the eviction
    assert len(slots) == 2
    slots.release("apiserver", "a1")
    assert (len(slots), slots.held_by("apiserver")) == (1, 0)


def test_a_bound_per_peer_outside_one_to_total_is_refused() -> None:
    with pytest.raises(ValueError, match="per_peer must be 1 to total"):
        PeerSlots(total=2, per_peer=3)
