"""The key space on its own, without sockets or xrun's wire format (what a second protocol on
the same store relies on): waits answer through their callback, leases fire for their owner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from xrun.runtime.store.data import KeySpace, Waiter
from xrun.runtime.store.errors import StoreError


class _Timer:
    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn: Callable[..., Any] | None = fn
        self.args = args

    def cancel(self) -> None:
        self.fn = None


class _Clock:
    """Timers that fire when the test says so."""

    def __init__(self) -> None:
        self.timers: list[_Timer] = []

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> _Timer:
        t = _Timer(fn, args)
        self.timers.append(t)
        return t

    def fire_all(self) -> None:
        for t in list(self.timers):
            if t.fn is not None:
                t.fn(*t.args)


def test_a_parked_wait_answers_through_its_callback_once() -> None:
    data = KeySpace(_Clock(), seed={"a": b"1"})
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
    clock = _Clock()
    data = KeySpace(clock)
    seen: list[bool] = []
    data.park(Waiter(("k",), False, lambda w, ok: seen.append(ok)), timeout=5)
    clock.fire_all()
    assert seen == [False] and data.waiters == {}


def test_leases_fire_on_expiry_or_when_their_owner_goes() -> None:
    clock = _Clock()
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
    data = KeySpace(_Clock(), seed={"text": b"abc"})
    assert data.add("n", 3) == 3 and data.values["n"] == b"3"
    with pytest.raises(StoreError, match="not an integer"):
        data.add("text", 1)
