"""The workers' key space: what torch-protocol connections share (keys, FIFO queues, parked
waits), kept apart from the rendezvous' ``data.KeySpace``.

Apart on purpose: a torch client has no credentials (torch's store has no authentication), so
it must not be able to name, count or list a rendezvous key or the agents' secret. Here it
cannot: this object is all a torch session can reach. The server keeps one per workers'
generation (a fresh one when the rendezvous forms a new round, see ``server.py``), so a
restarted group never reads the previous attempt's keys.

Every operation is O(1) in the number of keys, and a write touches only the waits parked on
that key: a wait keeps the set of its keys that are missing, so a WAIT on 1,000 keys costs
1,000 steps in all, not 1,000 per write. Runs on the server's loop thread only, hence no locks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence

__all__ = ["WorkersKeySpace"]


class _Wait:
    """A parked wait: its keys, the ones still missing, and whom to tell."""

    __slots__ = ("keys", "missing", "wake")

    def __init__(self, keys: tuple[str, ...], missing: set[str], wake: Callable[[], None]) -> None:
        self.keys = keys
        self.missing = missing
        self.wake = wake


class WorkersKeySpace:
    """Implements ``torch_handler.KeySpace``: values, queues, and waits on keys being present
    (a key is present when it has a value or a non-empty queue of that name)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = {}
        # key -> the waits that name it, in the order they were parked (a queue push wakes
        # the oldest one)
        self._waits: dict[str, dict[_Wait, None]] = {}

    # -- values ---------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value
        self._present(key, wake_all=True)

    def add(self, key: str, delta: int) -> int:
        total = int(self.values.get(key, b"0")) + delta  # ValueError: not an integer
        self.set(key, str(total).encode())
        return total

    def append(self, key: str, value: bytes) -> None:
        self.set(key, self.values.get(key, b"") + value)

    def delete(self, key: str) -> bool:
        if self.values.pop(key, None) is None:
            return False
        if not self.queues.get(key):
            self._absent(key)
        return True

    def num_keys(self) -> int:
        return len(self.values)

    def keys(self) -> list[str]:
        return list(self.values)

    # -- queues ---------------------------------------------------------------------------------

    def queue_push(self, key: str, value: bytes) -> None:
        self.queues.setdefault(key, deque()).append(value)
        self._present(key, wake_all=False)

    def queue_pop(self, key: str) -> bytes | None:
        queue = self.queues.get(key)
        if not queue:
            return None
        value = queue.popleft()
        if not queue:
            del self.queues[key]
            if key not in self.values:
                self._absent(key)
        return value

    def queue_len(self, key: str) -> int:
        return len(self.queues.get(key, ()))

    # -- waits ----------------------------------------------------------------------------------

    def _has(self, key: str) -> bool:
        return key in self.values or bool(self.queues.get(key))

    def present(self, keys: Sequence[str]) -> bool:
        return all(self._has(k) for k in keys)

    def park(self, keys: Sequence[str], wake: Callable[[], None]) -> Hashable | None:
        missing = {k for k in keys if not self._has(k)}
        if not missing:
            return None
        w = _Wait(tuple(dict.fromkeys(keys)), missing, wake)
        for k in w.keys:
            self._waits.setdefault(k, {})[w] = None
        return w

    def unpark(self, ticket: Hashable) -> None:
        if not isinstance(ticket, _Wait):
            return
        for k in ticket.keys:
            waits = self._waits.get(k)
            if waits is not None:
                waits.pop(ticket, None)
                if not waits:
                    del self._waits[k]

    @property
    def parked(self) -> int:
        """How many waits are parked (tests and the benchmark look)."""
        return len({w for waits in self._waits.values() for w in waits})

    def _present(self, key: str, *, wake_all: bool) -> None:
        """``key`` has a value (or a queue item) now: wake the waits that needed only it. A
        queue item wakes one wait (the oldest: its pop will take the item); the others keep
        waiting for the next one."""
        waits = self._waits.get(key)
        if not waits:
            return
        woke = False
        for w in list(waits):
            w.missing.discard(key)
            if w.missing:
                continue
            if woke and not wake_all:
                w.missing.add(key)
                continue
            self.unpark(w)
            woke = True
            w.wake()

    def _absent(self, key: str) -> None:
        """``key`` lost its value and queue: the waits on it need it again."""
        for w in self._waits.get(key, ()):
            w.missing.add(key)
