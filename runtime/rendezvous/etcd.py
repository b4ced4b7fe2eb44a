"""The etcd rendezvous (``--rdzv-backend etcd`` / ``etcd-v2``, torchrun's names): the same rounds
as c10d (elastic MIN:MAX, last call, scale-up, a lost node, restarts, the exit barrier), kept in
an etcd the cluster already runs instead of a store one agent serves, so no agent is the job's
single point of failure for the rendezvous.

``--rdzv-endpoint`` is etcd's client ``HOST[:PORT]`` (port 2379 by default, as torchrun's);
conf ``etcd_prefix`` roots the job's keys (default ``/xrun/rdzv``); conf ``protocol=https``
speaks TLS (``ca_cert``/``cacert``, ``ssl_cert``/``cert``, ``ssl_cert_key``/``key``, torchrun's
two spellings). Every timeout key of ``--rdzv-conf`` means what it means
for c10d.

Keys under ``<etcd_prefix>/<run_id>/``:

* ``state``: the job's one JSON document, only ever changed by compare-and-set on its revision:
  ``round`` (counts up), ``formed``, ``members`` (``[addr, sortkey, nproc, agent id, store,
  slot, node id]``, in rank order once formed), ``why`` (what ended the previous round),
  ``fin`` (members whose workers finished), ``wait`` (the last world's members a new round
  waits for: ``etcd_state.fresh``), ``quarantine`` (etcd_spares.py, etcd_budget.py), ``budget``
  and ``lone`` (restarts used, lone failures: etcd_budget.py), ``closed`` (the verdict);
* ``alive/<node id>``: one per agent, bound to the agent's lease (TTL heartbeat_timeout,
  renewed every heartbeat_interval): it vanishes when the agent dies (TTL) or leaves (revoke).

A round ends by starting the next one: whoever sees a reason (a member's ``alive`` key gone, a
restart request, a node waiting next to a world with room) writes ``round + 1``, not formed,
with ``why``; the old round's members see the round move on (RESTART) and join it. A node next
to a full world stands by. Joiners wait on etcd watches, never by polling; the round forms
when MAX nodes joined, or MIN did and no one joined for last_call_timeout. Ranks: members
sorted by (advertised address, sort key), as c10d; with ``--spares`` each node keeps its slot
and a spare takes a lost node's (etcd_spares.py).

The workers' store: every agent serves a ``StoreServer`` (torch's TCPStore protocol) on a free
port of its advertised address and names it in its member entry; the round's group rank 0's is
MASTER_ADDR/MASTER_PORT. An agent starts a new workers' generation in its store each time it
joins, before the round can form, so a round's workers never see the last round's keys. Group
rank 0 is therefore the "host" of the exit barrier: it waits for the others to finish before its
store (and its agent) goes away, then writes the verdict, bound to a lease of close_timeout
seconds: peers read it, then the job's state is gone and the run id is free again. The agents'
own keys (``kv()``) are in that store too (etcd_agent_kv.py).
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from typing import Any

from xrun.contract import ETCD_DEFAULT_PORT
from xrun.errors import UsageError

from ..store.client import StoreClient
from ..store.errors import StoreError
from ..store.server import StoreServer
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
from .conf import RdzvConfig, config_from_conf
from .endpoint import Endpoint, bind_address
from .etcd_agent_kv import AgentKeys
from .etcd_kv import EtcdClient, EtcdError, tls_context
from .etcd_leave import MIN_TTL, EtcdLeaving
from .etcd_spares import (
    ModulesPublisher,
    node_id,
    quarantine,
    refuse_quarantined,
    seal,
    took,
)
from .etcd_state import Member, fresh, lost, running, stayed_away, waiting
from .keys import closed_error
from .kv import KeyValue
from .spares import say

__all__ = ["EtcdRendezvousHandler", "create_etcd_handler"]

_WORKERS_KEY = "workers"


class EtcdRendezvousHandler(EtcdLeaving, RendezvousHandler):
    """One agent's membership in one job's rendezvous kept in etcd: the c10d handler's sibling
    (the agent cannot tell them apart), sharing only the interface and its ``__init__``."""

    def __init__(
        self,
        params: RendezvousParams,
        cfg: RdzvConfig,
        prefix: str,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(params, cfg)
        ep = params.endpoint
        self._etcd = EtcdClient(ep.host, ep.port, cfg.read_timeout, tls)
        self._etcd_endpoint = ep
        self._id = os.urandom(8).hex()
        self._prefix = f"{prefix.rstrip('/')}/{params.run_id}/"
        self._state_key = self._prefix + "state"
        self._alive = self._prefix + "alive/"
        # The workers' store, ours to serve should we be group rank 0 (see the module docstring).
        self._token = os.urandom(32)
        try:
            self._server = StoreServer(
                bind_address(self.addr), 0, self._token, workers_key=_WORKERS_KEY
            )
        except OSError as e:
            raise UsageError(
                f"cannot serve the workers' store on {self.addr!r}: {e}; give --local-addr an "
                f"address of this host"
            ) from None
        self._store_addr = str(Endpoint(self.addr, self._server.port))
        self._store_client: StoreClient | None = None
        here = "127.0.0.1" if ":" not in self._server.host else "::1"
        self._local_store = (here, self._server.port)
        self._keys = AgentKeys(
            self._etcd, self._prefix[:-1] + ".kv", params.run_id, self._token, cfg.read_timeout
        )
        self._generation = 0
        self._lease_id = 0
        self._lock = threading.Lock()  # guards the round state below and the event
        self._round = -1
        self._place: tuple[int, list[Member]] | None = None  # (rank, members) of our round
        self._event: tuple[RendezvousEvent, str] | None = None
        self._closed_failed = True
        self._lost = False  # closed by this node's own loss of etcd (see ``lost``)
        self._finished = self._closed = self._shut = False
        self._ready_r, self._ready_w = os.pipe()
        self._stop = threading.Event()
        # While we join, the watcher only renews our lease: a round we are not in yet has no
        # news for us, and N watchers reading the job at every arrival would make a
        # rendezvous of N agents cost N² reads more (benchmark 6). Set again once we joined.
        self._joining = False
        self._wake = threading.Event()
        self._ttl = max(MIN_TTL, int(-(-cfg.heartbeat_timeout // 1)))
        self._watcher: threading.Thread | None = None
        # our node's slot (--spares), its id (the quarantine), the modules shared with spares
        self._slot, self._node = -1, params.node_id or (node_id() if params.spares else "")
        self._mods_key = self._prefix + "modules"
        self._mods: tuple[bytes, int] | None = None  # the published modules, their revision
        self._mods_seen: set[str] = set()
        self._on_modules: Any = None
        self._publisher: ModulesPublisher | None = None
        self._stood_by = False
        self._vetted = False  # our node's quarantine looked at (once, at the first join)

    # -- what the agent reads ------------------------------------------------------------------

    @property
    def endpoint(self) -> Endpoint:
        return self._etcd_endpoint

    @property
    def is_host(self) -> bool:
        """Group rank 0 of the current round: its agent serves the workers' store."""
        return self._place is not None and self._place[0] == 0

    @property
    def workers_address(self) -> tuple[str, int]:
        if self._place is None:
            raise RendezvousError("no round has formed yet")
        ep = Endpoint.parse(self._place[1][0][4])
        return ep.host, ep.port

    @property
    def closed_failed(self) -> bool:
        return self._closed_failed

    @property
    def lost(self) -> bool:
        """Whether the job's end (a CLOSED event) is this node's loss of etcd, not a peer's
        verdict: the agent then says so instead of "closed by a peer"."""
        return self._lost

    # -- etcd ----------------------------------------------------------------------------------

    def _read(self) -> tuple[int, dict[str, Any] | None, int, set[str]]:
        """(revision, the state or None, the state's revision, the live node ids)."""
        rev, entries = self._etcd.get_prefix(self._prefix)
        state, srev, alive = None, 0, set()
        for e in entries:
            if e.key == self._state_key:
                state, srev = json.loads(e.value), e.mod_revision
            elif e.key.startswith(self._alive):
                alive.add(e.key[len(self._alive) :])
            elif e.key == self._mods_key:
                self._mods = (e.value, e.mod_revision)
        return rev, state, srev, alive

    def _write(self, state: dict[str, Any], srev: int, lease: int = 0) -> bool:
        return self._etcd.put_if(self._state_key, json.dumps(state).encode(), srev, lease)

    def _start(self) -> None:
        """Our lease and ``alive`` key, and the thread that renews it and watches the round."""
        if self._watcher is not None:
            return
        self._lease_id = self._etcd.grant(self._ttl)
        self._etcd.put(self._alive + self._id, self.addr.encode(), self._lease_id)
        self._watcher = threading.Thread(target=self._watch, name="xrun-etcd-watch", daemon=True)
        self._watcher.start()

    def _errors(self, e: EtcdError) -> RendezvousError:
        return RendezvousClosedError(f"rendezvous at {self.endpoint}: {e}", failed=True)

    # -- joining -------------------------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        self._new_generation()
        self._joining = True
        try:
            self._start()
            rnd, members = self._join(self._round)
        except EtcdError as e:
            # Not "closed by a peer": we could not reach (or use) etcd ourselves.
            raise RendezvousError(
                f"{e}; check that etcd runs there (--rdzv-endpoint is etcd's client "
                f"HOST:PORT, default port {ETCD_DEFAULT_PORT})"
            ) from None
        finally:
            self._joining = False
            self._wake.set()
        ids = [m[3] for m in members]
        rank = ids.index(self._id)
        offset = sum(int(m[2]) for m in members[:rank])
        world_size = sum(int(m[2]) for m in members)
        with self._lock:
            self._round, self._place, self._event = rnd, (rank, members), None
            os.set_blocking(self._ready_r, False)
            try:
                while os.read(self._ready_r, 64):
                    pass
            except BlockingIOError:
                pass
        if self._stood_by:  # the same line as c10d's spares: xrun status reads it
            say(f"a spare no more: took group rank {rank} in round {rnd}")
        if self.params.spares:
            self._slot, self._stood_by = rank, False
        sizes = tuple(int(m[2]) for m in members)
        addrs = tuple(str(m[0]) for m in members)
        return RendezvousInfo(
            round=rnd,
            group_rank=rank,
            group_world_size=len(members),
            rank_offset=offset,
            world_size=world_size,
            members=Members(lambda: (sizes, addrs)),
        )

    def _new_generation(self) -> None:
        """A fresh workers' key space in our store, before the round we join can form."""
        self._generation += 1
        try:
            if self._store_client is None:
                timeout = self.cfg.read_timeout
                self._store_client = StoreClient(
                    *self._local_store, self._token, connect_timeout=timeout, read_timeout=timeout
                )
            self._store_client.set(_WORKERS_KEY, str(self._generation).encode())
        except StoreError as e:
            raise RendezvousError(f"the workers' store of this agent failed: {e}") from None

    def _join(self, last: int) -> tuple[int, list[Member]]:
        """Join the first round after ``last`` that takes us; block until it forms."""
        p, cfg = self.params, self.cfg
        deadline = time.monotonic() + cfg.join_timeout
        me: Member = [self.addr, self.sortkey, p.local_world_size, self._id, self._store_addr]
        me += [self._slot, self._node]
        count, since = -1, time.monotonic()
        while True:
            rev, s, srev, alive = self._read()
            now = time.monotonic()
            if s is None:
                self._write(fresh(0, "", me, []), 0)
                continue
            if s["closed"] is not None:
                raise closed_error(json.dumps(s["closed"]).encode())
            if last < 0:
                self._vet(s)
            members: list[Member] = s["members"]
            ids = [m[3] for m in members]
            r = s["round"]
            if s["formed"]:
                if self._id in ids and r > last:
                    return r, members
                deadline = self._next_to_formed(s, srev, rev, alive, me, deadline)
                continue
            live = [m for m in members if m[3] in alive]
            if len(live) < len(members):  # a joiner died before the round formed
                self._write({**s, "members": live}, srev)
                continue
            if self._id not in ids:
                got = self._arrive(s, srev, rev, alive, me, deadline)
                if got is not None:
                    deadline = got
                    continue
            else:
                if len(members) != count:
                    count, since = len(members), now
                last_call = since + cfg.last_call_timeout
                if self._stopping(s, alive, rev, deadline):
                    continue
                if len(members) >= p.max_nodes or (
                    len(members) >= p.min_nodes and now >= min(last_call, deadline)
                ):
                    self._seal(s, srev, alive)
                    continue
                if now >= deadline:
                    self._withdraw()
                    raise RendezvousTimeoutError(
                        f"rendezvous {p.run_id!r} at {self.endpoint}: fewer than {p.min_nodes} "
                        f"node(s) joined within join_timeout={cfg.join_timeout:g}s; start the "
                        f"other nodes, check that they use the same endpoint and run id, or "
                        f"raise --rdzv-conf join_timeout"
                    )
                if len(members) >= p.min_nodes:
                    deadline_here = min(last_call, deadline)
                else:
                    deadline_here = deadline
                self._wait_state(rev, deadline_here - now)
                continue
            self._wait_state(rev, deadline - now)

    def _arrive(
        self, s: dict[str, Any], srev: int, rev: int, alive: set[str], me: Member, deadline: float
    ) -> float | None:
        """Take a seat in the unformed round ``s`` if it has room (with spares, the seats of the
        last world's members still stopping are theirs: a spare never displaces a survivor), or
        stand by as a spare: the join's deadline then. None: no room, wait as before."""
        p = self.params  # held: the seats of the last world's members still stopping, not ours
        held = waiting(s, alive) - (self._id in (s.get("wait") or ())) if p.spares else 0
        room = p.max_nodes - len(s["members"]) - held
        if room > 0:
            self._write({**s, "members": [*s["members"], me]}, srev)
            return deadline
        if p.spares:
            self._stand_by(s["round"], rev)
            return time.monotonic() + self.cfg.join_timeout
        return None

    def _vet(self, s: dict[str, Any]) -> None:
        """A quarantined node's new agent (lost: etcd_spares.py; failed alone: etcd_budget.py)
        is refused, at its first look only: a spare may itself have quarantined its node id."""
        if not self._vetted:
            refuse_quarantined(s, self._node, self.params.run_id)
            self._vetted = True

    def _seal(self, s: dict[str, Any], srev: int, alive: set[str]) -> None:
        """Form the round in ``s``: its members in rank order; with spares the last world's
        members it waited for in vain are quarantined in the same write."""
        p = self.params
        new = {**s, "formed": True, "members": seal(s["members"], p.max_nodes, p.spares)}
        if p.spares:
            new = quarantine(new, stayed_away(s, alive), s["round"] - 1)
        self._write(new, srev)

    def _next_to_formed(
        self,
        s: dict[str, Any],
        srev: int,
        rev: int,
        alive: set[str],
        me: Member,
        deadline: float,
    ) -> float:
        """We are not in the formed round ``s``: start the next round with us if the world must
        re-form (we were in it, a member was lost, or it has room), else stand by. The join's
        deadline: a spare's join_timeout runs from when it stops standing by."""
        p = self.params
        members: list[Member] = s["members"]
        gone = lost(s, alive)
        ours = self._id in {m[3] for m in members}
        # members finished and left: the job is ending, no node was lost
        ended = bool(s["fin"]) and not gone and not ours
        if not ended and (ours or gone or len(members) < p.max_nodes):
            why = (
                f"node {', '.join(m[0] for m in gone)} was lost (its lease expired)"
                if gone
                else f"node {self.addr} is waiting to join"
            )
            new = fresh(s["round"] + 1, why, me, running(s, alive), s, p.spares)
            self._write(quarantine(new, gone, s["round"]) if p.spares else new, srev)
            return time.monotonic() + self.cfg.join_timeout if p.spares else deadline
        if p.spares:  # a spare: stands by without join_timeout, taking the shared modules
            self._stand_by(s["round"], rev)
            return time.monotonic() + self.cfg.join_timeout
        now = time.monotonic()
        if now >= deadline:  # a full, live world (or one finishing): we stood by in vain
            what = "is finishing" if ended else f"is full ({p.max_nodes} nodes)"
            raise RendezvousTimeoutError(
                f"rendezvous {p.run_id!r} at {self.endpoint}: the running round {what} and "
                f"this node stood by for join_timeout={self.cfg.join_timeout:g}s without a slot "
                f"opening; raise --nnodes MAX to use it"
            )
        self._etcd.wait_change(self._prefix, rev, deadline - now)
        return deadline

    def _stand_by(self, rnd: int, rev: int) -> None:
        if not self._stood_by:
            self._stood_by = True
            say(f"standing by as a spare: the world of round {rnd} is full")
        if self._mods is not None and self._on_modules is not None:
            names = took(self._mods[0], self._mods_seen)
            if names:
                self._on_modules(names)
        # the whole prefix: a member's lease ending, the modules, the job closing; a few
        # seconds at a time, to see this handler shut down meanwhile
        self._etcd.wait_change(self._prefix, rev, 5.0)
        if self._stop.is_set():
            raise RendezvousClosedError("this agent is shutting down", failed=True)

    def _stopping(self, s: dict[str, Any], alive: set[str], rev: int, deadline: float) -> bool:
        """Wait (once) while members of the last world are still stopping their workers; True
        if we waited. Sealing meanwhile would run two worlds of one job at once, which then
        re-form each other's world without end (split brain, issue #31). A full round seals:
        a late member stands by, as any node beyond the maximum does."""
        ids = {m[3] for m in s["members"]}
        stopping = [i for i in s.get("wait", ()) if i in alive and i not in ids]
        if not stopping or len(ids) >= self.params.max_nodes:
            return False
        now = time.monotonic()
        if now >= deadline:
            self._withdraw()
            raise RendezvousTimeoutError(
                f"rendezvous {self.params.run_id!r} at {self.endpoint}: round {s['round'] - 1} "
                f"ended, but {len(stopping)} of its members did not arrive in round "
                f"{s['round']} within join_timeout={self.cfg.join_timeout:g}s (their workers "
                f"still stopping?); raise --rdzv-conf join_timeout or the agents' "
                f"--shutdown-timeout grace below it"
            )
        # the whole prefix: a member that dies meanwhile only loses its alive key
        self._etcd.wait_change(self._prefix, rev, deadline - now)
        return True

    def _wait_state(self, rev: int, timeout: float) -> None:
        """Wait for the next change of the state alone: N agents' ``alive`` keys coming and
        going would wake every joiner N more times (benchmark 6). A joiner that dies before
        the round forms is pruned at the next change, or left to the watchers if it is formed."""
        self._etcd.wait_change(self._state_key, rev, max(0.0, timeout))

    def _withdraw(self) -> None:
        """Leave a round that has not formed (we give up waiting)."""
        for _ in range(10):
            _, s, srev, _ = self._read()
            if s is None or s["formed"]:
                return
            members = [m for m in s["members"] if m[3] != self._id]
            if self._write({**s, "members": members}, srev):
                return

    # -- watching the round --------------------------------------------------------------------

    def _watch(self) -> None:
        """Renew our lease every heartbeat_interval; between renewals, wait on an etcd watch of
        the job's keys and, on any change, look whether our round is over."""
        interval = self.cfg.heartbeat_interval
        next_beat = time.monotonic() + interval
        rev = 0
        ok_at = time.monotonic()  # when etcd last answered us
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + interval
                    if not self._etcd.keep_alive(self._lease_id):
                        # We were silent too long and dropped: be alive again (our round is
                        # re-forming without us, and we will see it).
                        self._lease_id = self._etcd.grant(self._ttl)
                        self._etcd.put(self._alive + self._id, self.addr.encode(), self._lease_id)
                    # only after an answer: a failing _check below must not reset the clock
                    ok_at = time.monotonic()
                if self._joining:
                    self._wake.wait(max(0.0, next_beat - time.monotonic()))
                    self._wake.clear()
                    continue
                rev = self._check()
                ok_at = time.monotonic()
                if self._stop.is_set():
                    return
                self._etcd.wait_change(self._prefix, rev, max(0.0, next_beat - time.monotonic()))
            except EtcdError as e:
                # etcd is built to be briefly away (a leader election, a member restarting):
                # give up only once it has been silent as long as our lease lives, after which
                # the peers have dropped us anyway.
                silent = time.monotonic() - ok_at
                if silent >= self.cfg.heartbeat_timeout and self._round >= 0:
                    self._set_event(
                        self._round,
                        RendezvousEvent.CLOSED,
                        f"this node lost etcd at {self.endpoint} for {silent:.1f}s (heartbeat_"
                        f"timeout={self.cfg.heartbeat_timeout:g}s), so its lease ran out and the "
                        f"peers may go on without it: its workers were stopped ({e})",
                        True,
                        lost=True,  # our own loss, not a peer's failure
                    )
                self._stop.wait(min(interval, 0.5))

    def _check(self) -> int:
        """One look at the job: report our round's end, or end it if a member is lost."""
        with self._lock:
            rnd, seat = self._round, self._place
        rev, s, srev, alive = self._read()
        if rnd < 0 or seat is None or s is None:
            return rev
        if s["closed"] is not None:
            err = closed_error(json.dumps(s["closed"]).encode())
            self._set_event(rnd, RendezvousEvent.CLOSED, err.reason, err.failed)
        elif s["round"] != rnd:
            self._set_event(rnd, RendezvousEvent.RESTART, s.get("why") or "the round re-formed")
        elif s["formed"] and not self._finished:
            # A member that finished and left is done, not lost: its peers run on.
            gone = lost(s, alive)
            if gone:
                why = f"node {', '.join(m[0] for m in gone)} was lost (its lease expired)"
                new = fresh(rnd + 1, why, None, running(s, alive), s, self.params.spares)
                self._write(quarantine(new, gone, rnd) if self.params.spares else new, srev)
        return rev

    def _set_event(
        self, rnd: int, event: RendezvousEvent, reason: str, failed: bool = True, lost: bool = False
    ) -> None:
        with self._lock:
            if self._shut or self._round != rnd or self._event is not None:
                return
            self._event = (event, reason)
            self._lost = lost
            if event is RendezvousEvent.CLOSED:
                self._closed_failed = failed
            os.write(self._ready_w, b"!")

    def fileno(self) -> int:
        return self._ready_r

    def poll_event(self) -> tuple[RendezvousEvent, str] | None:
        with self._lock:
            return self._event

    def warm_spares(self, pool: Any) -> None:
        """``--spares --recover warm``: share the modules our workers import with the job's
        spares, and take theirs while standing by as one (etcd_spares.py, "Warm modules")."""
        self._publisher = ModulesPublisher(self._etcd, self._mods_key, lambda: self.is_host)
        pool.share, self._on_modules = self._publisher, pool.take_modules

    def kv(self) -> KeyValue:
        """The agents' keys, in the store of the round's group rank 0 (etcd_agent_kv.py)."""
        with self._lock:
            rnd, place = self._round, self._place
        return self._keys.of_round(rnd, place, self._local_store, self._lease_id)

    def shutdown(self) -> None:
        if self._shut:
            return
        if self.params.spares and self._round >= 0 and not (self._finished or self._closed):
            self._mark_left()  # on purpose: not a lost node to quarantine
        if self._round >= 0 and not (self._finished or self._closed):
            # Leaving mid-round without close/finish: let the peers re-form at once.
            try:
                self.request_restart("left the rendezvous")
            except RendezvousError:
                pass
        with self._lock:  # the watcher reports nothing from now on (the pipe closes below)
            self._shut = True
        if self._publisher is not None:
            self._publisher.close()
        self._stop.set()
        self._wake.set()
        if self._lease_id:
            try:
                self._etcd.revoke(self._lease_id)  # our alive key goes now, not after a TTL
            except EtcdError:
                pass
        if self._store_client is not None:
            self._store_client.close()
        self._keys.close()
        self._server.stop()
        self._etcd.close()
        os.close(self._ready_r)
        os.close(self._ready_w)


def create_etcd_handler(params: RendezvousParams) -> EtcdRendezvousHandler:
    """Validate the etcd-specific parts of ``params`` (UsageError) and build the handler."""
    conf = params.conf
    prefix = conf.get("etcd_prefix", "/xrun/rdzv").strip()
    if not prefix.startswith("/") or len(prefix) > 200:
        raise UsageError(
            f"--rdzv-conf etcd_prefix={prefix[:40]!r} must be an absolute etcd key path, e.g. "
            f"etcd_prefix=/xrun/rdzv"
        )
    if params.endpoint.port == 0:
        raise UsageError(
            f"rendezvous endpoint {str(params.endpoint)!r}: the etcd rendezvous needs etcd's client "
            f"HOST:PORT (default port {ETCD_DEFAULT_PORT}), not port 0"
        )
    return EtcdRendezvousHandler(params, config_from_conf(conf), prefix, tls_context(conf))
