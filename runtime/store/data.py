"""The store's key space: values, parked waits and leases, whatever the wire protocol.

A protocol's session (``session.py`` for xrun's) decodes a request, calls these methods and
encodes their results in its own format; nothing here knows about frames, request ids or
statuses. A parked wait reports back through its ``done`` callback and a lease's owner is
whatever object the session passes (itself), so a second protocol served next to xrun's
(torch's TCPStore, issue #14) can share the same keys, waits and leases.

Runs on the server's loop thread only, hence no locks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .errors import StoreError

__all__ = ["Clock", "KeySpace", "Timer", "Waiter"]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the key space needs of the event loop: timers (``loop.Loop`` is one)."""

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer: ...


# Waiter and _Lease are compared by identity (they sit in sets and dicts) and are plain
# classes: a dataclass costs the agent's start-up (benchmark 1) ~0.4 ms to make.
class Waiter:
    """A parked wait for ``keys`` (all of them, or any one). ``done(waiter, True)`` once they
    are there, ``done(waiter, False)`` when its timeout expires first; either way exactly once,
    and already unparked."""

    __slots__ = ("keys", "want_all", "done", "timer", "at")

    def __init__(
        self,
        keys: tuple[str, ...],
        want_all: bool,
        done: Callable[[Waiter, bool], None],
        timer: Timer | None = None,
    ) -> None:
        self.keys = keys
        self.want_all = want_all
        self.done = done
        self.timer = timer
        # want_all: the index of the one key it is parked on (see KeySpace.park)
        self.at = 0


class _Lease:
    __slots__ = ("fire_key", "fire_value", "timer", "owner")

    def __init__(
        self, fire_key: str, fire_value: bytes, timer: Timer, owner: object | None
    ) -> None:
        self.fire_key = fire_key
        self.fire_value = fire_value
        self.timer = timer
        self.owner = owner  # the session whose loss fires it (None: only the timer does)


class KeySpace:
    """The keys, their parked waits and their leases."""

    def __init__(self, clock: Clock, seed: Mapping[str, bytes] | None = None) -> None:
        """``seed``: keys present from the start (before any client can connect)."""
        self.clock = clock
        self.values: dict[str, bytes] = dict(seed or {})
        self.waiters: dict[str, set[Waiter]] = {}
        self.leases: dict[str, _Lease] = {}

    # -- values ---------------------------------------------------------------------------------

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value
        waiters = self.waiters.get(key)
        if not waiters:
            return
        for w in list(waiters):
            if not w.want_all:
                self.finish_wait(w, True)
            elif w.keys[w.at] == key:
                self._advance(w)

    def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the integer stored (as ASCII decimal) at ``key``; the new value."""
        old = self.values.get(key, b"0")
        try:
            new = int(old) + delta
        except ValueError:
            raise StoreError(
                f"ADD on key {key!r} whose value {old[:40]!r} is not an integer"
            ) from None
        self.put(key, str(new).encode())
        return new

    def delete(self, key: str) -> None:
        self.values.pop(key, None)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        vals = self.values
        return [vals.get(k) for k in keys]

    def ready(self, keys: tuple[str, ...], want_all: bool) -> bool:
        vals = self.values
        return not keys or (all if want_all else any)(k in vals for k in keys)

    # -- waits ----------------------------------------------------------------------------------

    def park(self, w: Waiter, timeout: float) -> None:
        """Hold ``w`` until its keys are there or ``timeout`` s pass (<= 0: no limit).

        A wait for any key is parked on each of them. A wait for all of them is parked on one
        key at a time, the first one missing, and moves on when it comes: a round's gate waits
        for 16,384 ``left`` keys (rendezvous/rounds.py), and parked on all of them, with every
        arrival re-checking the whole list, it cost the store O(N) per key, O(N^2) per round
        (benchmarks/rdzv_replace.py: 5.3 s of the store's CPU to replace one of 1,024 nodes)."""
        if w.want_all:
            w.at = 0
            self._advance(w, parked=False)
        else:
            for k in w.keys:
                self.waiters.setdefault(k, set()).add(w)
        if timeout > 0 and (not w.want_all or w.at < len(w.keys)):
            w.timer = self.clock.call_later(timeout, self.finish_wait, w, False)

    def _advance(self, w: Waiter, parked: bool = True) -> None:
        """A want-all wait: park it on its next missing key, or answer it. Keys before ``at``
        were there when it passed them; one deleted since (rare) is found by the last check."""
        keys, vals, at = w.keys, self.values, w.at
        while True:
            while at < len(keys) and keys[at] in vals:
                at += 1
            if at < len(keys):
                break
            missing = next((i for i, k in enumerate(keys) if k not in vals), -1)
            if missing < 0:
                if parked:
                    self.finish_wait(w, True)
                else:
                    w.at = at  # ready at once: park() sets no timer, the caller answers
                    w.done(w, True)
                return
            at = missing
        if parked:
            self._unlink(w, keys[w.at])
        w.at = at
        self.waiters.setdefault(keys[at], set()).add(w)

    def _unlink(self, w: Waiter, k: str) -> None:
        s = self.waiters.get(k)
        if s is not None:
            s.discard(w)
            if not s:
                del self.waiters[k]

    def unpark(self, w: Waiter) -> None:
        """Forget ``w`` without an answer (its session is gone)."""
        if w.timer is not None:
            w.timer.cancel()
        if w.want_all:
            if w.at < len(w.keys):
                self._unlink(w, w.keys[w.at])
            return
        for k in w.keys:
            self._unlink(w, k)

    def finish_wait(self, w: Waiter, ok: bool) -> None:
        self.unpark(w)
        w.done(w, ok)

    # -- leases ---------------------------------------------------------------------------------

    def lease(
        self, key: str, ttl: float, fire_key: str, fire_value: bytes, owner: object | None
    ) -> None:
        """Unless renewed (same key) within ``ttl`` s, set ``fire_key`` = ``fire_value``;
        ttl <= 0 releases. With an ``owner``, ``drop_owner`` fires it at once."""
        old = self.leases.pop(key, None)
        if old is not None:
            old.timer.cancel()
            # A renewal from another connection keeps the owner.
            owner = owner if owner is not None else old.owner
        if ttl <= 0:
            return
        timer = self.clock.call_later(ttl, self.fire_lease, key)
        self.leases[key] = _Lease(fire_key, fire_value, timer, owner)

    def fire_lease(self, key: str) -> None:
        lease = self.leases.pop(key, None)
        if lease is None:
            return
        lease.timer.cancel()
        if lease.fire_key not in self.values:
            self.put(lease.fire_key, lease.fire_value)

    def drop_owner(self, owner: object, keys: set[str]) -> None:
        """``owner`` is gone (its connection closed): fire the leases among ``keys`` it owns."""
        for key in keys:
            lease = self.leases.get(key)
            if lease is not None and lease.owner is owner:
                self.fire_lease(key)

    def clear_timers(self) -> None:
        for lease in self.leases.values():
            lease.timer.cancel()
        self.leases.clear()
