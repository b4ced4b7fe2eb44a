"""The sealer's slot rule of a job with spares (runtime/rendezvous/spares.py ``by_slot``)."""

from __future__ import annotations

from xrun.runtime.rendezvous.spares import by_slot


def entry(addr: str, index: int, slot: int) -> tuple[str, str, int, int, int]:
    return (addr, f"{index:08d}", index, 2, slot)


def test_members_keep_their_slots_and_a_newcomer_takes_the_free_one() -> None:
    # the node on slot 0 was lost; the survivor sorts first but keeps slot 1
    members = [entry("10.0.0.9", 1, -1), entry("10.0.0.1", 2, 1)]
    assert [e[2] for e in by_slot(members, 2)] == [1, 2]


def test_newcomers_fill_the_lowest_free_slots_in_rank_rule_order() -> None:
    members = [entry("c", 1, -1), entry("x", 2, 2), entry("b", 3, -1), entry("y", 4, 0)]
    # slots: 0 -> y, 1 -> b (first by the rank rule), 2 -> x, 3 -> c
    assert [e[0] for e in by_slot(members, 4)] == ["y", "b", "x", "c"]


def test_fewer_nodes_than_slots_close_up_in_order() -> None:
    # no spare left: slots 1 and 3 remain, they become ranks 0 and 1 in that order
    members = [entry("a", 1, 3), entry("b", 2, 1)]
    assert [e[0] for e in by_slot(members, 4)] == ["b", "a"]


def test_a_slot_claimed_twice_or_out_of_range_is_a_newcomer() -> None:
    members = [entry("a", 1, 0), entry("b", 2, 0), entry("c", 3, 7)]
    assert [e[0] for e in by_slot(members, 3)] == ["a", "b", "c"]
