"""``StoreRendezvousHandler``: the ``RendezvousHandler`` of the ``c10d`` and ``static`` backends,
whose rounds live in an xrun store that one of the agents serves.

``create_store_handler(params)`` builds it (``backends.create_handler`` validated ``params``);
joining a round is ``rounds.py``'s, the store it talks to ``hosting.StoreLink``'s, its round
lease ``leases.Lease``'s.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

from ..store.client import StoreClient
from ..store.errors import StoreAuthError, StoreError, StoreTimeoutError
from ..store.protocol import Op, Status, wait_fields
from .api import (
    Members,
    RendezvousClosedError,
    RendezvousError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParams,
    RendezvousTimeoutError,
)
from .conf import RdzvConfig, config_from_conf, load_token
from .endpoint import Endpoint
from .hosting import StoreLink
from .keys import FINISHED, Keys, Seat, World, closed_error, verdict
from .kv import KeyValue

if TYPE_CHECKING:
    from .budget import Ledger
from .leases import Lease
from .rounds import Rounds

__all__ = ["StoreRendezvousHandler", "create_store_handler"]


class StoreRendezvousHandler(RendezvousHandler):
    """One agent's membership in one job's rendezvous kept in an xrun store."""

    def __init__(self, params: RendezvousParams, cfg: RdzvConfig, token: bytes | None) -> None:
        super().__init__(params, cfg)
        # Binds the store now when this agent hosts it; connections open on first use
        # (next_rendezvous), where the agent handles rendezvous errors.
        self._link = StoreLink(params, cfg, token)
        self._keys = Keys(params.run_id)
        self._lock = threading.Lock()  # guards the watch connection and the round state below
        self._lease = Lease(self._link, self._keys, cfg, self.addr, self._lock)
        self._rounds = Rounds(
            self._link, self._keys, self._lease, params, cfg, self.addr, self.sortkey, self._prearm
        )
        self._ledger: Ledger | None = None
        if params.node_id and params.max_nodes > 1:
            from .budget import Ledger  # multi-node agents only

            self._ledger = Ledger(
                self._link,
                self._keys,
                params.node_id,
                cfg.join_timeout,
                self._place,
                min_nodes=params.min_nodes,
            )
            self._lease.lost = (self._ledger.qkey, self._ledger.host)
            self._rounds.quarantine = (self._ledger.qkey, params.node_id)
        self._round = -1
        self._index = 0
        self._rank = -1
        self._seat: Seat | None = None
        self._world: World | None = None  # the round's members, read when needed (the host)
        self._armed_rid = 0
        self._ready_fd = -1
        self._armed_for = -2
        self._event: tuple[RendezvousEvent, str] | None = None
        self._closed_failed = True
        self._finished = False
        self._closed = False
        self._shut = False
        self._kv: KeyValue | None = None
        self._publisher: Any = None  # spares.Publisher (warm_spares)

    @property
    def endpoint(self) -> Endpoint:
        """The store's real endpoint (port 0 resolved)."""
        return self._link.endpoint

    @property
    def is_host(self) -> bool:
        return self._link.is_host

    @property
    def workers_address(self) -> tuple[str, int]:
        """(MASTER_ADDR, MASTER_PORT): the job's store, where the workers' torch TCPStore
        clients find it (the rendezvous port; each round's workers get an empty key space)."""
        return self._link.workers_address

    # -- joining -------------------------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it forms (see the package docstring)."""
        try:
            rnd, index, seat = self._rounds.join(self._round)
        except StoreAuthError as e:
            raise RendezvousError(str(e)) from None
        except StoreTimeoutError as e:
            raise RendezvousTimeoutError(f"{e}; is the agent at {self.endpoint} running?") from None
        except StoreError as e:
            raise RendezvousClosedError(
                f"lost the rendezvous store at {self.endpoint}: {e}", failed=True
            ) from None
        with self._lock:
            self._round, self._index, self._rank, self._seat = rnd, index, seat.rank, seat
            self._world = None
            self._event = None
        return RendezvousInfo(
            round=rnd,
            group_rank=seat.rank,
            group_world_size=seat.nodes,
            rank_offset=seat.rank_offset,
            world_size=seat.world_size,
            members=Members(lambda: self._members(rnd)),
        )

    def _members(self, rnd: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Round ``rnd``'s member list, from the store (``RendezvousInfo.addrs``)."""
        try:
            world = self._read_world(rnd)
        except StoreError as e:
            raise RendezvousClosedError(
                f"lost the rendezvous store at {self.endpoint}: {e}"
            ) from None
        return world.local_world_sizes, world.addrs

    def _read_world(self, rnd: int) -> World:
        raw = self._link.client.get(self._keys.of(rnd, "members"))
        if raw is None:
            raise RendezvousError(f"round {rnd}'s member list is not in the store")
        return World.parse(rnd, raw)

    # -- watching the round --------------------------------------------------------------------

    def _prearm(self, rnd: int) -> None:
        """We joined round ``rnd``: queue its watch, to leave with our wait for the round to
        form (one message less per node than arming it once the round formed). If the round
        went stale before it formed, the watch answers at once: the world re-forms, as it
        should."""
        with self._lock:
            client = self._link.client
            if self._armed_rid:
                client.forget(self._armed_rid)
            keys = [self._keys.of(rnd, "stale"), self._keys.closed]
            self._armed_rid = client.submit(Op.WAIT, wait_fields(keys, False, None), queue=True)
            self._armed_for = rnd

    def _arm(self) -> StoreClient:
        """Make sure a WAIT any(stale, closed) for the current round is pending (lock held).
        It rides on the handler's one connection: its answer is read by ``poll_event``."""
        client = self._link.client
        if self._armed_for != self._round:
            if self._armed_rid:
                client.forget(self._armed_rid)  # a previous round's watch: its answer is moot
            keys = (
                [self._keys.of(self._round, "stale"), self._keys.closed]
                if self._round >= 0
                else [self._keys.closed]
            )
            self._armed_rid = client.submit(Op.WAIT, wait_fields(keys, False, None))
            self._armed_for = self._round
        return client

    def fileno(self) -> int:
        """Readable as soon as the current round is stale or the job closed (see poll_event)."""
        with self._lock:
            try:
                client = self._arm()
                if self._event is not None or client.answered(self._armed_rid):
                    # The news came in already, read by a call that shared the connection:
                    # the socket will not turn readable for it, this will.
                    return self._readable_fd()
                return client.fileno()
            except (StoreError, OSError) as e:
                raise RendezvousClosedError(
                    f"lost the rendezvous store at {self.endpoint}: {e}"
                ) from None

    def _readable_fd(self) -> int:
        """A descriptor that is always readable (a pipe whose write end is closed)."""
        if self._ready_fd < 0:
            r, w = os.pipe()
            os.close(w)
            self._ready_fd = r
        return self._ready_fd

    @property
    def closed_failed(self) -> bool:
        """After ``poll_event`` returned CLOSED: did the job fail (a peer gave up, the store was
        lost) rather than finish? The agent exits 1 with the reason for the first, 0 for the
        second."""
        return self._closed_failed

    def poll_event(self) -> tuple[RendezvousEvent, str] | None:
        """Non-blocking: (CLOSED, reason) / (RESTART, reason) / None; drains ``fileno()``.
        For CLOSED, ``closed_failed`` tells a failed job from a finished one."""
        with self._lock:
            if self._event is not None:
                return self._event
            try:
                resp = self._arm().poll(self._armed_rid)
                if resp is not None and resp.status == Status.OK:
                    stale, closed = (
                        resp.values()[-2:] if self._round >= 0 else (None, resp.values()[0])
                    )
                    if closed is not None:
                        err = closed_error(closed)
                        self._closed_failed = err.failed
                        self._event = (RendezvousEvent.CLOSED, err.reason)
                    elif stale is not None:
                        self._event = (RendezvousEvent.RESTART, stale.decode(errors="replace"))
                if resp is not None and self._event is None:
                    self._armed_for = -2  # answered without news (an error): watch again
            except (StoreError, OSError, ConnectionError) as e:
                self._closed_failed = True
                self._event = (
                    RendezvousEvent.CLOSED,
                    f"lost the rendezvous store at {self.endpoint}: {e}",
                )
            return self._event

    # -- leaving -------------------------------------------------------------------------------

    def request_restart(self, reason: str) -> None:
        """A local worker failed; every node of the round (this one too) sees RESTART."""
        if self._round < 0:
            return
        with contextlib.suppress(StoreError):
            self._link.client.set(
                self._keys.of(self._round, "stale"), f"node {self.addr}: {reason}".encode()
            )

    def close(self, failed: bool, reason: str) -> None:
        """This node gives up: every peer sees CLOSED (and next_rendezvous raises it)."""
        self._closed = True
        self._lease.leave()
        with contextlib.suppress(StoreError):
            self._link.client.set(self._keys.closed, verdict(failed, f"node {self.addr}: {reason}"))

    def finish(self, timeout: float | None = None) -> list[str]:
        """Our workers all succeeded. The store's host waits (<= ``timeout``, default conf
        ``exit_barrier_timeout``) for the round's other nodes to finish or leave before it may
        shut the store down: "leave together". Then it closes the job: not failed when every
        node finished, failed (naming the others) if not, so that a node still running, or
        re-forming after a late failure, stops rather than waiting for a store that is about
        to go away. Returns the addresses of the nodes that did not finish (host only)."""
        self._finished = True
        self._lease.leave()
        if self._round < 0 or self._seat is None:
            return []
        if timeout is None:
            timeout = self.cfg.exit_barrier_timeout
        unfinished: list[str] = []
        with contextlib.suppress(StoreError):
            # From now on a newcomer leaves the round alone (rounds.Rounds._notify_if_room).
            self._link.client.add(self._keys.of(self._round, "fate"), FINISHED)
            self._link.client.set(self._keys.of(self._round, f"fin/{self._index}"), b"done")
            if not self._link.is_host:
                return []
            fins = self._wait_fin(timeout)
            assert self._world is not None
            addrs = self._world.addrs
            unfinished = [a for a, v in zip(addrs, fins, strict=True) if v != b"done"]
            if unfinished:
                self._closed = True  # shutdown keeps serving (close_timeout) so they read why
                closed = verdict(
                    True,
                    f"node {self.addr} finished, but {', '.join(unfinished)} did not "
                    f"finish within exit_barrier_timeout={timeout:g}s (or left without finishing); "
                    f"if nodes legitimately finish further apart, raise --rdzv-conf "
                    f"exit_barrier_timeout",
                )
            else:
                closed = verdict(False, "the job finished")
            self._link.client.set(self._keys.closed, closed)
        return unfinished

    def _wait_fin(self, timeout: float) -> list[bytes | None]:
        """Wait until every member of the round has left; each one's ``fin`` value."""
        if self._world is None:
            self._world = self._read_world(self._round)
        keys = [self._keys.of(self._round, f"fin/{i}") for i in self._world.indices]
        return self._link.client.wait(keys, timeout=timeout) or self._link.client.multi_get(keys)

    def kv(self) -> KeyValue:
        """The agent's keys. They travel on a connection of their own, so that a blocking
        ``get`` never holds up this handler's rendezvous calls (or a ``set`` from another thread
        of the same agent). The connection is made outside the lock: the heartbeat thread
        takes that lock, and a slow connect (DNS, a busy store's backlog: up to read_timeout)
        held under it lapsed this node's lease, so a healthy node was dropped and quarantined."""
        with self._lock:
            if self._kv is not None:
                return self._kv
        try:
            client = self._link.open_client()
        except StoreError as e:
            raise RendezvousClosedError(
                f"lost the rendezvous store at {self.endpoint}: {e}"
            ) from None
        with self._lock:
            if self._kv is None and not self._shut:
                self._kv = KeyValue(client, self.params.run_id)
                return self._kv
            kv = self._kv
        client.close()  # another thread was first, or the handler shut down meanwhile
        if kv is None:
            raise RendezvousClosedError(f"the rendezvous handler for {self.endpoint} shut down")
        return kv

    def ledger(self) -> Ledger | None:
        return self._ledger

    def warm_spares(self, pool: Any) -> None:
        """``--spares --recover warm``: the agent's warm pool shares the modules its workers
        import with the job's spares, and, parked as a spare, takes theirs (spares.py, "Warm
        modules"; issue #35: a replacement's imports held up the whole world)."""
        from .spares import Publisher  # --spares only

        # In a thread of its own, on a connection of its own: a hung store must not hold up the
        # agent's watch loop, which calls pool.share (nor queue the other kv() calls behind it)
        self._publisher = Publisher(self._link.open_client, self.params.run_id)
        pool.share = self._publisher
        self._rounds.on_modules = pool.take_modules

    def _place(self) -> tuple[int, int]:
        """(round, arrival index) of the round this node is in (the ledger's)."""
        return self._round, self._index

    def shutdown(self) -> None:
        """Stop heartbeats, close sockets, stop the store if this node serves it; idempotent."""
        if self._shut:
            return
        if self._publisher is not None:
            self._publisher.close()
        if self._round >= 0 and not (self._finished or self._closed):
            # Leaving mid-round without close/finish: let the peers re-form at once.
            self.request_restart("left the rendezvous")
        self._lease.leave()
        if self._round >= 0:
            with contextlib.suppress(StoreError):
                self._link.client.set(self._keys.of(self._round, f"fin/{self._index}"), b"done")
                if self._link.is_host and self._closed:
                    # Keep serving until the peers have read the verdict (or close_timeout).
                    self._wait_fin(self.cfg.close_timeout)
        with self._lock:
            self._shut = True
            self._lease.stop()
            if self._ready_fd >= 0:
                os.close(self._ready_fd)
                self._ready_fd = -1
            if self._kv is not None:
                self._kv.close()
        self._link.close()


def create_store_handler(params: RendezvousParams) -> StoreRendezvousHandler:
    """Build the handler for valid ``params`` (the secret, if any, is read here)."""
    cfg = config_from_conf(params.conf)
    token = load_token(cfg)
    if token is None and params.private_store:
        token = os.urandom(32)
    return StoreRendezvousHandler(params, cfg, token)
