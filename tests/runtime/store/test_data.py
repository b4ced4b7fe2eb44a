"""The key space on its own, without sockets or xrun's wire format (what a second protocol on
the same store relies on): waits answer through their callback, leases fire for their owner."""

from __future__ import annotations

import pytest

from tests.runtime.store.manual_clock import ManualClock
from xrun.runtime.store.data import KeySpace, Waiter
from xrun.runtime.store.errors import StoreError


def test_a_parked_wait_answers_through_its_callback_once() -> None:
    data = KeySpace(ManualClock(), seed={"a": b"1"})
    seen: list[tuple[bool, list[bytes | None]]] = []
    w = Waiter(("a", "b"), True, lambda w, ok: seen.append((ok, data.get_many(w.keys))))
    assert not data.ready(w.keys, w.want_all)
    data.park(w, timeout=0)
    data.put("c", b"x")  # not a key it waits for
    assert seen == []
    data.put("b", b"2")
    assert seen == [(True, [b"1", b"2"])]
    data.put("b", b"3")  # unparked: no second answer
    assert len(seen) == 1 and data.waiters == {}


def test_a_wait_times_out_through_the_clock() -> None:
    clock = ManualClock()
    data = KeySpace(clock)
    seen: list[bool] = []
    data.park(Waiter(("k",), False, lambda w, ok: seen.append(ok)), timeout=5)
    clock.fire_all()
    assert seen == [False] and data.waiters == {}


def test_leases_fire_on_expiry_or_when_their_owner_goes() -> None:
    clock = ManualClock()
    data = KeySpace(clock)
    owner = object()
    data.lease("l1", 10, "stale", b"l1 expired", owner=None)
    data.lease("l2", 10, "gone", b"owner left", owner=owner)
    data.drop_owner(owner, {"l2"})
    assert data.values == {"gone": b"owner left"}
    clock.fire_all()
    assert data.values["stale"] == b"l1 expired"
    assert data.leases == {}


def test_add_keeps_ascii_decimal_and_refuses_other_values() -> None:
    data = KeySpace(ManualClock(), seed={"text": b"abc"})
    assert data.add("n", 3) == 3 and data.values["n"] == b"3"
    with pytest.raises(StoreError, match="not an integer"):
        data.add("text", 1)


def test_a_wait_for_all_of_many_keys_is_parked_on_one_at_a_time() -> None:
    """A round's gate waits for every member's ``left`` key (16,384 of them): parked on all of
    them, with each arrival re-checking the whole list, it cost the store O(N) per key and
    O(N^2) per round (benchmarks/rdzv_replace.py). Parked on the first missing key only, it
    moves on as they come, in any order, and answers once, when the last one is there."""
    data = KeySpace(ManualClock())
    keys = tuple(f"left/{i}" for i in range(1000))
    seen: list[bool] = []
    w = Waiter(keys, True, lambda w, ok: seen.append(ok))
    data.park(w, timeout=0)
    assert list(data.waiters) == ["left/0"]
    for i in [*range(999, 499, -1), *range(500)]:  # the second half first, then the rest
        assert seen == []
        data.put(f"left/{i}", b"")
        assert len(data.waiters) <= 1
    assert seen == [True] and data.waiters == {}


def test_a_key_deleted_behind_a_wait_for_all_holds_its_answer() -> None:
    data = KeySpace(ManualClock())
    seen: list[bool] = []
    data.park(Waiter(("a", "b", "c"), True, lambda w, ok: seen.append(ok)), timeout=0)
    data.put("a", b"1")
    data.put("b", b"2")
    data.delete("a")  # passed, then gone: the answer waits for it again
    data.put("c", b"3")
    assert seen == [] and list(data.waiters) == ["a"]
    data.put("a", b"4")
    assert seen == [True] and data.waiters == {}


def test_a_wait_for_all_that_times_out_leaves_nothing_parked() -> None:
    clock = ManualClock()
    data = KeySpace(clock)
    seen: list[bool] = []
    data.park(Waiter(("a", "b"), True, lambda w, ok: seen.append(ok)), timeout=5)
    data.put("a", b"1")
    clock.fire_all()
    assert seen == [False] and data.waiters == {}
    data.put("b", b"2")
    assert seen == [False]
