"""Joining a round: arrive, wait on the server for the world to form, seal it when it is time.

The join/seal half of the protocol in the package docstring. ``Rounds.join`` is all a handler
calls; everything else here is one step of it. Every wait happens on the server (``WAIT``), so a
node sends O(1) messages per round whatever the number of nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from xrun.errors import UsageError

from ..store.protocol import Op, add_fields, wait_fields
from .api import RendezvousParams, RendezvousTimeoutError
from .conf import RdzvConfig
from .hosting import StoreLink
from .keys import FINISHED, HOST_KEY, SEAL, Keys, Seat, World, closed_error, verdict
from .leases import Lease

__all__ = ["Rounds"]


class Rounds:
    """One node's side of the join protocol. ``addr`` is the address the node advertises,
    ``sortkey`` what orders it among the members (see the rank rule)."""

    def __init__(
        self,
        link: StoreLink,
        keys: Keys,
        lease: Lease,
        params: RendezvousParams,
        cfg: RdzvConfig,
        addr: str,
        sortkey: str,
        on_join: Callable[[int], None] | None = None,
    ) -> None:
        """``on_join(r)``: called when this node has taken its place in round ``r``, before
        it waits for the round to form (the handler queues its round watch there)."""
        self._on_join = on_join
        self._link = link
        self._keys = keys
        self._lease = lease
        self.params = params
        self.cfg = cfg
        self.addr = addr
        self._sortkey = sortkey
        self._static = params.backend == "static"
        # quarantine/<node id> (budget.py): a fresh agent of a quarantined node is refused
        self.quarantine: tuple[str, str] | None = None  # (key, node id)
        # --spares (spares.py): a newcomer parks until a slot opens; members keep their slot
        self._spares = params.spares > 0 and not self._static
        self._slot = -1  # the group rank this node held in its last round (spares only)
        self._parked = False  # a spare that parked and has not held a slot since
        # --spares --recover warm: the warm pool's, fed the modules the job's workers import
        self.on_modules: Callable[[list[str]], None] | None = None

    def join(self, last_round: int) -> tuple[int, int, Seat]:
        """Join the first round after ``last_round`` (-1: none yet) that takes this node and
        block until it forms: ``(round, arrival index, seat)``."""
        cfg, c = self.cfg, self._link.client
        deadline = time.monotonic() + cfg.join_timeout
        # Our lease in round ``last_round`` is kept until we hold one in the next round
        # (``Lease.take`` then leaves the old one): see "one world at a time".
        cur_closed = wait_fields([self._keys.cur, self._keys.closed, HOST_KEY], True, 0)
        first_add: int | None = None
        if last_round < 0:
            # A fresh node nearly always joins round 0: read the hints and join round 0 in one
            # round trip. If round 0 is already sealed (cur > 0), the extra ADD lands on a
            # counter that is >= SEAL for good and changes nothing.
            # A quarantined node is refused before it is counted: the quarantine dates from a
            # formed round, so round 0 is sealed and this ADD changes nothing.
            q = self.quarantine
            if q is not None:
                cur_closed = wait_fields(
                    [self._keys.cur, self._keys.closed, HOST_KEY, q[0]], True, 0
                )
            r_get, r_add = c.pipeline(
                [(Op.WAIT, (cur_closed,)), (Op.ADD, (add_fields(self._keys.of(0, "join"), 1),))]
            )
            cur_raw, closed_raw, host_raw, *q_raw = r_get.values()
            self._check_host(host_raw)
            if q is not None and q_raw[0] is not None:
                from .budget import refusal  # multi-node agents only

                raise refusal(q[1], self.params.run_id, q_raw[0])
            first_add = r_add.body.i64()
        else:
            cur_raw, closed_raw, _ = c.pipeline([(Op.WAIT, (cur_closed,))])[0].values()
        if closed_raw is not None:
            raise closed_error(closed_raw)
        rnd = max(int(cur_raw or 0), last_round + 1)
        if rnd != 0:
            first_add = None
        if rnd > 0 and last_round != rnd - 1:
            # We are new to a running job: if its world has room, make it re-form with us.
            running = c.get(self._keys.of(rnd - 1, "world"))
            if running is not None:
                self._notify_if_room(rnd - 1, Seat.parse(running).nodes)
        while True:
            rnd, index, deadline = self._join(rnd, deadline, first_add, last_round)
            first_add = None
            seat = self._await_seat(rnd, index, deadline)
            if seat.rank >= 0:
                break
            # Formed without us (our node entry came too late for the sealer): the next round.
            self._lease.release(rnd, index)
            self._notify_if_room(rnd, seat.nodes)
            rnd += 1
        self._slot = seat.rank if self._spares else -1
        if self._parked:
            # `xrun status` reads this line (xrun/cli/spares_view.py): keep its words.
            from .spares import say

            say(f"a spare no more: took group rank {seat.rank} in round {rnd}")
            self._parked = False
        return rnd, index, seat

    def _check_host(self, host_raw: bytes | None) -> None:
        """Refuse, at once, a store served by another job's agent: it stops serving when *its*
        job ends, which would take this job down mid-run (see "One store, one job" in the package docstring)."""
        host = host_raw.decode(errors="replace") if host_raw is not None else None
        if host is not None and host != self.params.run_id:
            raise UsageError(
                f"the rendezvous store at {self._link.endpoint} is served by the agent of another job "
                f"(run id {host!r}), not {self.params.run_id!r}: a store lives only as long as "
                f"its job, so two jobs cannot share an endpoint; give each job its own "
                f"--rdzv-endpoint port (or port 0 / --standalone on a single node)"
            )

    def _join(
        self, rnd: int, deadline: float, first_add: int | None, last_round: int
    ) -> tuple[int, int, float]:
        """Take an arrival index in the first round still open at or after ``rnd``
        (``first_add``: the result of an ADD on round ``rnd`` already made); the join deadline
        (a spare's starts when it leaves its parking)."""
        c, p = self._link.client, self.params
        while True:
            if first_add is None and self._spares and 0 < rnd != last_round + 1:
                # Not a member of the running round: a spare until a slot opens (spares.py).
                from .spares import park  # --spares only

                park(c, self._keys, rnd - 1, self._notify_if_room, self.on_modules)
                self._parked = True
                deadline = time.monotonic() + self.cfg.join_timeout
            v = c.add(self._keys.of(rnd, "join"), 1) if first_add is None else first_add
            first_add = None
            if v <= p.max_nodes:
                break
            # Full or sealed: that round runs (or is forming) without us.
            if v >= SEAL and not self._spares:  # (a spare parks on it: the next turn)
                vals = c.wait(
                    [self._keys.of(rnd, "world"), self._keys.closed],
                    want_all=False,
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                if vals is None:
                    raise RendezvousTimeoutError(self._timeout_msg())
                if vals[1] is not None:
                    raise closed_error(vals[1])
                assert vals[0] is not None
                self._notify_if_room(rnd, Seat.parse(vals[0]).nodes)
            rnd += 1
        # No need to wait for these answers: the server applies them before our next request.
        c.post_set(
            self._keys.of(rnd, f"node/{v}"),
            f"{p.local_world_size}\t{self._sortkey}\t{self._slot}\t{self.addr}".encode(),
        )
        self._lease.take(c, rnd, v)
        if self._on_join is not None:
            self._on_join(rnd)
        return rnd, v, deadline

    def _notify_if_room(self, rnd: int, nodes: int) -> None:
        # A world with room for us restarts to take us in; a full one keeps running (we stand by).
        if nodes < self.params.max_nodes and not self._static:
            c = self._link.client
            # ...unless one of its nodes finished (its workers all succeeded): the job is ending.
            # Re-formed now, the round's other nodes stopped their workers and ran the script
            # again with us, while the finished node waited for them at its exit barrier until
            # exit_barrier_timeout (300 s) and closed the job as failed. One counter decides
            # which came first, our request or a finish (handler.finish adds FINISHED): we then
            # wait in the next round, which ends with the job's "finished" verdict.
            if c.add(self._keys.of(rnd, "fate"), 1) >= FINISHED:
                return
            c.set(self._keys.of(rnd, "stale"), f"node {self.addr} is waiting to join".encode())

    def _await_seat(self, rnd: int, index: int, deadline: float) -> Seat:
        """Wait (on the server) until round ``rnd`` forms, sealing it when it is time; this
        node's seat in it (rank -1: formed without it)."""
        c, p, cfg = self._link.client, self.params, self.cfg
        seat_key = self._keys.of(rnd, f"seat/{index}")
        known = index  # the highest arrival count we know of
        if rnd > 0:
            formed = self._await_previous_round(rnd, index, deadline)
            if formed is not None:
                return formed
        if index == p.max_nodes:
            self._try_seal(rnd, deadline)
        stale_key = self._keys.of(rnd, "stale")
        stale_seen = False
        while True:
            remaining = deadline - time.monotonic()
            # stale before the round forms: a node that joined it died. Seal now: the world
            # forms stale, so its members re-form at once without the dead node, instead of
            # waiting forever for a MAX-th node that will never seal.
            keys = [seat_key, self._keys.closed, self._keys.closed if stale_seen else stale_key]
            last_call = False
            if p.min_nodes <= known == index < p.max_nodes:
                # The last call is the latest arrival's alone (with MIN in): each earlier node
                # woken by the next arrival, or all of them by the MIN-th, cost an elastic job
                # one more wake-up, ADD and WAIT per node. An earlier one waits for its seat;
                # if the latest dies, its lease makes the round stale: the stale round is
                # sealed by whoever sees it first. (MIN = MAX: the MAX-th arrival seals.)
                keys.append(self._keys.of(rnd, f"node/{known + 1}"))
                last_call = True
            timeout = min(cfg.last_call_timeout, remaining) if last_call else remaining
            vals = c.wait(keys, want_all=False, timeout=max(0.0, timeout))
            if vals is None:
                if last_call:
                    # The last call ran out (or join_timeout did, with MIN already here: then
                    # form what we have rather than fail).
                    self._try_seal(rnd, deadline)
                    known = p.max_nodes
                    continue
                self._withdraw(rnd, index)
                raise RendezvousTimeoutError(self._timeout_msg())
            if vals[1] is not None:
                raise closed_error(vals[1])
            if vals[0] is not None:
                return Seat.parse(vals[0])
            if vals[2] is not None and not stale_seen:
                self._try_seal(rnd, deadline)
                known = p.max_nodes  # sealed now, by us or another: wait for the world
                stale_seen = True
                continue
            count = c.add(self._keys.of(rnd, "join"), 0)
            known = p.max_nodes if count >= SEAL else max(known + 1, min(count, p.max_nodes))

    def _await_previous_round(self, rnd: int, index: int, deadline: float) -> Seat | None:
        """Round ``rnd`` may form only once round ``rnd - 1`` is stale *and* every member of it
        is out of it (``r/left/i``, see ``leases.py``): otherwise nodes standing by while a
        full world runs would form a second world of the same job, and a node that made a
        world with room re-form could form one alone while that world's members are still
        stopping their workers (split brain; on a busy machine, or with workers slow to stop,
        the two sides then kept taking turns). A member re-forming sets its ``left`` only
        after it arrived in the next round, so it is counted there when the gate opens; one
        that died or hung is out once its connection closes or its heartbeats lapse. (torch's
        c10d rendezvous, likewise, opens the next round once the last participant of the
        complete one has left it.) None when the gate opened; our seat when ``rnd`` formed
        meanwhile.

        One node keeps the gate: the first arrival reads the member list and waits for their
        N ``left`` keys, then sets ``r/out``; the others wait for that one key. Every node
        waiting for the N keys itself cost the store O(N) per node: in a 1,024-node job a
        replacement took 10-17 s, 5 s of it the store decoding and answering 1,024 lists of
        1,024 keys (benchmarks/rdzv_replace.py). If the keeper is lost before the gate opens
        (``rnd`` goes stale), each node keeps it for itself."""
        c, k = self._link.client, self._keys
        seat_key = k.of(rnd, f"seat/{index}")
        vals = c.wait(
            [k.of(rnd - 1, "stale"), seat_key, k.closed],
            want_all=False,
            timeout=max(0.0, deadline - time.monotonic()),
        )
        if vals is None:
            self._withdraw(rnd, index)
            raise RendezvousTimeoutError(
                f"rendezvous {self.params.run_id!r} at {self._link.endpoint}: the running round is full "
                f"({self.params.max_nodes} nodes) and this node stood by for join_timeout="
                f"{self.cfg.join_timeout:g}s without a slot opening; raise --nnodes MAX to use it"
            )
        if vals[2] is not None:
            raise closed_error(vals[2])
        if vals[1] is not None:
            return Seat.parse(vals[1])
        out = k.of(rnd - 1, "out")
        if index != 1:
            vals = c.wait(
                [out, seat_key, k.closed, k.of(rnd, "stale")],
                want_all=False,
                timeout=max(0.0, deadline - time.monotonic()),
            )
            if vals is not None:
                if vals[2] is not None:
                    raise closed_error(vals[2])
                if vals[1] is not None:
                    return Seat.parse(vals[1])
                if vals[0] is not None:
                    return None
        if vals is not None and self._members_left(rnd - 1, deadline):
            c.post_set(out, b"")
            return None
        self._withdraw(rnd, index)
        raise RendezvousTimeoutError(
            f"rendezvous {self.params.run_id!r} at {self._link.endpoint}: round {rnd - 1} went "
            f"stale, but its members did not leave it within join_timeout="
            f"{self.cfg.join_timeout:g}s (their workers still stopping?); raise --rdzv-conf "
            f"join_timeout or the agents' --shutdown-timeout grace below it"
        )

    def _members_left(self, rnd: int, deadline: float) -> bool:
        """Wait until every member of round ``rnd`` (stale, so its member list is written:
        a round goes stale only once it has begun to form) is out of it; False on timeout."""
        c, k = self._link.client, self._keys
        vals = c.wait(
            [k.of(rnd, "members"), k.closed],
            want_all=False,
            timeout=max(0.0, deadline - time.monotonic()),
        )
        if vals is None:
            return False
        if vals[1] is not None:
            raise closed_error(vals[1])
        assert vals[0] is not None
        left = [k.of(rnd, f"left/{i}") for i in World.parse(rnd, vals[0]).indices if i]
        return not left or c.wait(left, timeout=max(0.0, deadline - time.monotonic())) is not None

    def _withdraw(self, rnd: int, index: int) -> None:
        # An empty node entry tells a later sealer to leave us out.
        self._link.client.set(self._keys.of(rnd, f"node/{index}"), b"")
        self._lease.release(rnd, index)

    def _try_seal(self, rnd: int, deadline: float) -> None:
        c, p = self._link.client, self.params
        v = c.add(self._keys.of(rnd, "join"), SEAL)
        if not SEAL <= v < 2 * SEAL:
            return  # someone else sealed it
        n = min(v - SEAL, p.max_nodes)
        keys = [self._keys.of(rnd, f"node/{i}") for i in range(1, n + 1)]
        # Every counted node sets its key right after its ADD; wait briefly for stragglers.
        vals = c.wait(
            keys, timeout=min(self.cfg.read_timeout, max(0.0, deadline - time.monotonic()))
        )
        if vals is None:
            vals = c.multi_get(keys)
        entries: list[tuple[str, str, int, int, int]] = []
        for i, raw in enumerate(vals, start=1):
            if not raw:
                continue  # died between ADD and SET, or withdrew: leave it out
            nproc, sortkey, slot, addr = raw.decode().split("\t", 3)
            entries.append((addr, sortkey, i, int(nproc), int(slot)))
        if any(e[4] >= 0 for e in entries):  # --spares: members keep their slots
            from .spares import by_slot

            entries = by_slot(entries, p.max_nodes)
        members = [e[:4] for e in entries]
        if self._static:
            members.sort(key=lambda m: m[1])
            ranks = [int(m[1]) for m in members]
            if ranks != list(range(p.max_nodes)):
                reason = (
                    f"static rendezvous: node ranks {ranks} are not exactly 0..{p.max_nodes - 1}; "
                    f"give every node a distinct --node-rank below --nnodes"
                )
                c.set(self._keys.closed, verdict(True, reason))
                return
        elif not any(e[4] >= 0 for e in entries):
            members.sort()
        self._publish(rnd, n, members)

    def _publish(self, rnd: int, counted: int, members: list[tuple[str, str, int, int]]) -> None:
        """Write round ``rnd``'s world: the members in rank order, one seat per arrival (the
        ``counted`` ones left out get rank -1), the summary, then ``cur``. In one write: the
        server applies it in order, so whoever sees ``cur`` finds the round formed."""
        c, k = self._link.client, self._keys
        nodes, world_size = len(members), sum(m[3] for m in members)
        # The workers' store of round r starts empty: a new generation before any seat (the
        # old round's workers are gone: every member stopped its workers before joining).
        c.post_set(k.workers, str(rnd).encode())
        c.post_set(k.of(rnd, "members"), World.encode(members))
        seated: set[int] = set()
        offset = 0
        for rank, (_, _, index, nproc) in enumerate(members):
            c.post_set(k.of(rnd, f"seat/{index}"), Seat(rank, offset, nodes, world_size).encode())
            seated.add(index)
            offset += nproc
        left_out = Seat(-1, 0, nodes, world_size).encode()
        for index in range(1, counted + 1):
            if index not in seated:
                c.post_set(k.of(rnd, f"seat/{index}"), left_out)
        c.post_set(k.of(rnd, "world"), left_out)
        c.set(k.cur, str(rnd + 1).encode())

    def _timeout_msg(self) -> str:
        p = self.params
        return (
            f"rendezvous {p.run_id!r} at {self._link.endpoint}: fewer than {p.min_nodes} node(s) joined "
            f"within join_timeout={self.cfg.join_timeout:g}s; start the other nodes, check that "
            f"they use the same endpoint and run id, or raise --rdzv-conf join_timeout"
        )
