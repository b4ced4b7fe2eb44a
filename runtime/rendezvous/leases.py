"""A node's membership lease in the round it joined, and the one thread that renews them all.

When a node joins round ``r`` as arrival ``i`` it takes two leases owned by its connection:
``r/lease/i`` (renewed by heartbeats; on expiry or disconnect the store sets ``r/stale``) and
``r/finlease/i`` (on disconnect the store sets ``r/fin/i``: "gone"), and ``r/leftlease/i``
(renewed with the first; on expiry or disconnect the store sets ``r/left/i``). So a SIGKILLed
agent is noticed at once (its socket closes) and a hung one after ``heartbeat_timeout``.

``r/left/i`` says "arrival i is out of round r": its node took its place in a later round (set
right after that arrival, so a node that re-forms is already counted in the next round when
its old round lets go), released the round (finish, close, shutdown), died or hung. Round
``r + 1`` forms only once every member of round ``r`` is out of it (see ``rounds.py``).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from typing import Protocol

from ..lazylog import LazyLogger
from ..store.client import StoreClient
from ..store.errors import StoreError
from ..store.protocol import Op, lease_fields, pack_bytes
from .conf import RdzvConfig
from .hosting import StoreLink
from .keys import Keys

__all__ = ["HEARTBEATS", "Lease"]

log = LazyLogger(__name__)

_NEVER = 1e9  # a lease ttl that only a closed connection (or a release) ends


class _Beater(Protocol):
    def beat(self) -> float | None: ...


class Heartbeats:
    """Renews every live lease every heartbeat_interval from one daemon thread per process,
    whatever the number of handlers (the benchmark runs 1024)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Beater]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def add(self, b: _Beater, due: float) -> None:
        """Call ``b.beat()`` at ``due`` (monotonic), then whenever it says (None: no more)."""
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, b))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="xrun-rdzv-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is b:
                self._cond.notify()  # only an earlier deadline needs to wake the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, _, b = heapq.heappop(self._heap)
            try:
                nxt = b.beat()
            except Exception:  # one handler's bug must not stop everyone's heartbeats
                log.exception("rendezvous heartbeat failed")
                nxt = None
            if nxt is not None:
                self.add(b, nxt)


HEARTBEATS = Heartbeats()


class Lease:
    """One handler's lease: ``take`` on joining a round, ``release`` on leaving it, ``beat``
    from the heartbeat thread. ``lock`` is the handler's. Heartbeats travel on the handler's
    one connection, sent at once whatever call is waiting there (``StoreClient.post_now``)."""

    def __init__(
        self, link: StoreLink, keys: Keys, cfg: RdzvConfig, addr: str, lock: threading.Lock
    ) -> None:
        self._link = link
        self._keys = keys
        self._cfg = cfg
        self._addr = addr
        self._lock = lock
        self.held: tuple[int, int] | None = None  # (round, arrival index)
        # (quarantine key, host): a lease that quarantines this node if it is lost (budget.py)
        self.lost: tuple[str, str] | None = None
        self._beating = False
        self._stopped = False

    def message(self, rnd: int, index: int) -> str:
        """What the lease writes to ``r/stale`` when it fires."""
        return (
            f"node {self._addr} (round {rnd}, arrival {index}) is gone: its connection closed or "
            f"it missed heartbeats for {self._cfg.heartbeat_timeout:g}s"
        )

    def take(self, client: StoreClient, rnd: int, index: int) -> None:
        """Take the leases of arrival ``index`` in round ``rnd`` and keep them renewed."""
        k, fire = self._keys, self.message(rnd, index)
        # Owned by this connection: if our agent dies, its socket closes and the peers hear of it
        # at once; a hung agent (socket open, no heartbeats) is dropped after heartbeat_timeout.
        client.post(
            Op.LEASE,
            lease_fields(
                k.of(rnd, f"lease/{index}"),
                self._cfg.heartbeat_timeout,
                k.of(rnd, "stale"),
                fire.encode(),
                fire_on_disconnect=True,
            ),
        )
        # And when our connection closes we count as "left" for the host's leave-together wait
        # (finish / close), which then need not sit out its whole timeout for a dead node.
        client.post(
            Op.LEASE,
            lease_fields(
                k.of(rnd, f"finlease/{index}"),
                _NEVER,
                k.of(rnd, f"fin/{index}"),
                b"gone",
                fire_on_disconnect=True,
            ),
        )
        # Out of round r too if we die or hang before we leave it ourselves (the next round's
        # sealer waits for it, see rounds.py).
        client.post(
            Op.LEASE,
            lease_fields(
                k.of(rnd, f"leftlease/{index}"),
                self._cfg.heartbeat_timeout,
                k.of(rnd, f"left/{index}"),
                b"gone",
                fire_on_disconnect=True,
            ),
        )
        if self.lost is not None:
            client.post(Op.LEASE, self._lost_fields(rnd, index, fire_on_disconnect=True))
        with self._lock:
            old, self.held = self.held, (rnd, index)
            start_beating = not self._beating
            self._beating = True
        if old is not None and old != (rnd, index):
            # Leave the old round only now, after our arrival in this one (queued before this, on
            # the same connection): whoever sees our old ``left`` finds us counted here already.
            for op, fields in self._releases(*old):
                client.post(op, fields)
        if start_beating:
            HEARTBEATS.add(self, time.monotonic() + self._cfg.heartbeat_interval)

    def _lost_fields(self, rnd: int, index: int, fire_on_disconnect: bool = False) -> bytes:
        from .budget import lost_value  # multi-node agents only

        assert self.lost is not None
        key, host = self.lost
        return lease_fields(
            self._keys.of(rnd, f"lostlease/{index}"),
            self._cfg.heartbeat_timeout,
            key,
            lost_value(host, rnd),
            fire_on_disconnect=fire_on_disconnect,
        )

    def release(self, rnd: int, index: int) -> None:
        """Give up the leases of round ``rnd`` (if they are the ones held)."""
        with self._lock:
            if self.held != (rnd, index):
                return
            self.held = None
        # On the connection the heartbeats take too, in order: a renewal sent just before
        # cannot revive the lease after this release (and later mark a round we left as stale).
        with contextlib.suppress(StoreError):
            client = self._link.connected
            if client is not None:
                client.post_now(*self._releases(rnd, index))

    def _releases(self, rnd: int, index: int) -> list[tuple[Op, bytes]]:
        """The requests that take arrival ``index`` out of round ``rnd``: its leases released
        (ttl 0: they fire no more), then ``r/left/i`` set."""
        k = self._keys
        return [
            *(
                (Op.LEASE, lease_fields(k.of(rnd, f"{name}/{index}"), 0, "", b""))
                for name in ("lease", "finlease", "leftlease", "lostlease")[: 4 if self.lost else 3]
            ),
            (Op.SET, pack_bytes(k.of(rnd, f"left/{index}").encode()) + pack_bytes(b"left")),
        ]

    def leave(self) -> None:
        """Release whatever lease is held."""
        if self.held is not None:
            self.release(*self.held)

    def stop(self) -> None:
        """No more heartbeats (the handler shuts down; caller holds the lock)."""
        self._stopped = True

    def beat(self) -> float | None:
        """Renew our lease (fire-and-forget, on the handler's connection); next due time or None."""
        cfg = self._cfg
        with self._lock:
            if self._stopped:
                return None
            if self.held is None:
                return time.monotonic() + cfg.heartbeat_interval
            rnd, index = self.held
            client = self._link.connected
            try:
                if client is None:
                    raise StoreError("not connected")
                fire = self.message(rnd, index)
                lost = [(Op.LEASE, self._lost_fields(rnd, index))] if self.lost else []
                client.post_now(
                    *lost,
                    (
                        Op.LEASE,
                        lease_fields(
                            self._keys.of(rnd, f"lease/{index}"),
                            cfg.heartbeat_timeout,
                            self._keys.of(rnd, "stale"),
                            fire.encode(),
                        ),
                    ),
                    (
                        Op.LEASE,
                        lease_fields(
                            self._keys.of(rnd, f"leftlease/{index}"),
                            cfg.heartbeat_timeout,
                            self._keys.of(rnd, f"left/{index}"),
                            b"gone",
                        ),
                    ),
                )
            except StoreError as e:
                # The store is gone (its host died): the watch fd reports that to the agent.
                log.warning(
                    "rendezvous heartbeat to %s failed, stopping them: %s", self._link.endpoint, e
                )
                self._beating = False
                return None
        return time.monotonic() + cfg.heartbeat_interval
