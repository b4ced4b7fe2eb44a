"""A dict-backed KeySpace for the tests: the reference semantics the handler expects of one.

Test code, not production: the store wing provides the real key space. Waits are indexed by
every key they name and re-checked whenever one of those keys is written, so a wait fires
exactly when all its keys are present.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass


@dataclass
class _Parked:
    keys: tuple[str, ...]
    wake: Callable[[], None]


class DictKeySpace:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = {}
        self.parked: dict[int, _Parked] = {}
        self._by_key: dict[str, list[int]] = {}
        self._tickets = itertools.count(1)

    # --- values ---

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self._written(key, wake_all=True)

    def add(self, key: str, delta: int) -> int:
        total = int(self.data.get(key, b"0")) + delta
        self.set(key, str(total).encode())
        return total

    def append(self, key: str, value: bytes) -> None:
        self.set(key, self.data.get(key, b"") + value)

    def delete(self, key: str) -> bool:
        return self.data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.data)

    def keys(self) -> list[str]:
        return list(self.data)

    # --- queues ---

    def queue_push(self, key: str, value: bytes) -> None:
        self.queues.setdefault(key, deque()).append(value)
        self._written(key, wake_all=False)

    def queue_pop(self, key: str) -> bytes | None:
        queue = self.queues.get(key)
        return queue.popleft() if queue else None

    def queue_len(self, key: str) -> int:
        return len(self.queues.get(key, ()))

    # --- waits ---

    def present(self, keys: Sequence[str]) -> bool:
        return all(k in self.data or self.queues.get(k) for k in keys)

    def park(self, keys: Sequence[str], wake: Callable[[], None]) -> Hashable | None:
        if self.present(keys):
            return None
        ticket = next(self._tickets)
        self.parked[ticket] = _Parked(tuple(keys), wake)
        for key in dict.fromkeys(keys):
            self._by_key.setdefault(key, []).append(ticket)
        return ticket

    def unpark(self, ticket: Hashable) -> None:
        if not isinstance(ticket, int):
            return
        parked = self.parked.pop(ticket, None)
        if parked is None:
            return
        for key in dict.fromkeys(parked.keys):
            tickets = self._by_key[key]
            tickets.remove(ticket)
            if not tickets:
                del self._by_key[key]

    def _written(self, key: str, *, wake_all: bool) -> None:
        for ticket in list(self._by_key.get(key, ())):
            parked = self.parked.get(ticket)
            if parked is not None and self.present(parked.keys):
                self.unpark(ticket)
                parked.wake()
                if not wake_all:
                    return
