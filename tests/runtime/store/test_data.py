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
