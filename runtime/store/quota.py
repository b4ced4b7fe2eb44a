"""A cap on what torch clients can make the agent hold: the workers' key space.

torch's TCPStore protocol lets any admitted client store values of up to 64 MiB each, as many
as it likes (issue #26: 16 x 8 MiB writes grew an agent from 23 to 164 MB). What the workers
keep there in practice is small (rendezvous ids, barrier counters, NCCL unique ids), so the key
space is capped at :data:`MAX_BYTES` of keys and values (queued items included) and
:data:`MAX_KEYS` keys. A write past either cap is refused: torch's protocol has no error
answer, so the writing client's connection is closed (its call raises torch's
``DistNetworkError``) and the agent logs one line naming the cap. Freed bytes (delete, a queue
pop, a smaller value) count again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from ..lazylog import LazyLogger
from .errors import ProtocolError
from .torch_handler import KeySpace

log = LazyLogger(__name__)

MAX_BYTES = 1 << 30  # 1 GiB of keys and values
MAX_KEYS = 1 << 20


class CappedKeySpace:
    """``inner`` (a ``torch_handler.KeySpace``), refusing writes past the caps."""

    def __init__(
        self, inner: KeySpace, max_bytes: int | None = None, max_keys: int | None = None
    ) -> None:
        self.inner = inner
        self.max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self.max_keys = MAX_KEYS if max_keys is None else max_keys
        self.bytes = 0

    def _charge(self, key: str, grow: int) -> None:
        new_key = self.inner.get(key) is None and not self.inner.queue_len(key)
        total = self.bytes + grow + (len(key) if new_key else 0)
        if total > self.max_bytes or (new_key and self.inner.num_keys() >= self.max_keys):
            why = (
                f"the workers' key space is full ({self.bytes:,} bytes in "
                f"{self.inner.num_keys():,} keys; caps {self.max_bytes:,} bytes, "
                f"{self.max_keys:,} keys): write to {key[:80]!r} refused"
            )
            log.warning("store: %s", why)
            raise ProtocolError(why)
        self.bytes = total

    def _release(self, key: str, freed: int) -> None:
        gone = self.inner.get(key) is None and not self.inner.queue_len(key)
        self.bytes = max(0, self.bytes - freed - (len(key) if gone else 0))

    # -- writes, charged ---------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        old = self.inner.get(key)
        self._charge(key, len(value) - len(old or b""))
        self.inner.set(key, value)

    def add(self, key: str, delta: int) -> int:
        old = self.inner.get(key) or b""
        self._charge(key, 21 - min(len(old), 21))  # an int64 in decimal: at most 20 digits + sign
        return self.inner.add(key, delta)

    def append(self, key: str, value: bytes) -> None:
        self._charge(key, len(value))
        self.inner.append(key, value)

    def queue_push(self, key: str, value: bytes) -> None:
        self._charge(key, len(value))
        self.inner.queue_push(key, value)

    def delete(self, key: str) -> bool:
        old = self.inner.get(key)
        done = self.inner.delete(key)
        if done:
            self._release(key, len(old or b""))
        return done

    def queue_pop(self, key: str) -> bytes | None:
        value = self.inner.queue_pop(key)
        if value is not None:
            self._release(key, len(value))
        return value

    # -- the rest, as they are -----------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def keys(self) -> list[str]:
        return self.inner.keys()

    def present(self, keys: Sequence[str]) -> bool:
        return self.inner.present(keys)

    def park(self, keys: Sequence[str], wake: Callable[[], None]) -> Hashable | None:
        return self.inner.park(keys, wake)

    def unpark(self, ticket: Hashable) -> None:
        self.inner.unpark(ticket)

    def queue_len(self, key: str) -> int:
        return self.inner.queue_len(key)
