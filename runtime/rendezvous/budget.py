"""The job-wide restart budget and the quarantine, kept in the rendezvous store (c10d, static).

``--max-restarts`` used to count per agent: in a multi-node job every agent had its own
restarts, so N nodes failing in turn restarted the job up to N times the budget, and an agent
that died and came back started again from zero (pytorch #147064, #108158). Here a multi-node
job keeps one count in its store, ``<run_id>/rdzv/budget/used``, so every agent agrees on it:

* **One restart per failed round.** A node whose workers failed (or stalled) in round ``r``
  reports it (``r/fail/<arrival>`` = the failure's signature) and takes a ticket,
  ``ADD r/failn 1``. The first ticket of the round adds 1 to ``budget/used`` and writes the
  result to ``r/used``; the others read it there. So a restart that several nodes take
  together (every node's workers failed) counts once, and every node decides the same: the
  budget is spent when ``used > max_restarts`` (the first ticket holder's ``--max-restarts``).
  A node joining later reads ``budget/used`` after each round (its workers'
  ``TORCHELASTIC_RESTART_COUNT``): an agent that leaves and comes back cannot reset it.
* **Quarantine.** A node is not readmitted into the job once
  (a) its agent was lost: its connection closed or its heartbeats lapsed while it was a member
      of a round. A lease the node takes with its round leases fires then, server-side, and
      writes ``quarantine/<node id>`` - no window in which a fast restart could rejoin first;
      a node that leaves on purpose (finish, close, SIGTERM) releases it;
  (b) its workers failed *alone* ``QUARANTINE_AFTER`` (2) times: a failure of round ``r`` is
      alone when no other member of ``r`` reported the same signature (the root failure's
      reason with digits blanked: ``RuntimeError: bad batch on rank #``). The node waits until
      every other member of ``r`` has reported or left ``r`` (bounded by join_timeout), then
      compares. A failure that could quarantine its node (the node already has
      ``QUARANTINE_AFTER - 1``) is marked ``r/risk`` before the restart request, and only
      then do the peers give their own workers ``SETTLE_S`` to fail alike before stopping
      them; a first failure costs the restart nothing (warm recovery counts milliseconds).
      So a bug every node hits may count once as alone, never twice: it quarantines nobody.
      Nor is a node quarantined for failing alone when the job could not form a world
      without it (fewer other members than ``--nnodes`` MIN), or when its agent serves the
      store (its leaving would end the job): that would end a job with restarts left for
      what may be chance (two kill -9s); it restarts;
      peers that were merely stopped by the restart, or failed differently (a collective
      error), leave the failing node alone. Counted per node id in ``lone/<node id>``.
  A quarantined node's next agent is refused at its first join with a one-line reason
  (``NodeQuarantinedError``); one quarantined by (b) leaves by itself. (An agent that hung
  past heartbeat_timeout and then recovered is quarantined but, already in the job, is not
  refused: the refusal is at an agent's first join, so that agents sharing a node id - see
  below - are not turned away mid-job.) The job continues
  without it (elastic) or waits for a replacement (fixed size: a spare, or join_timeout).

**Node id**: ``$XRUN_NODE_ID`` when set, else the host name. It is what the quarantine keys
on: the rank rule's sort key (process id) changes with every agent, and a node rank is a
slot that a replacement may take (spares), not a machine. Several agents of one job on one
host (local tests, local_cwd replicas) need distinct ``XRUN_NODE_ID``s, or a lost agent
quarantines the host: the agents already in the job go on (the refusal is at an agent's first
join), new ones from that host are refused.

The rules themselves (the order of the steps above, what they come to, the lines) are
verdict.py's, shared with the etcd backends, which keep the budget and the lone-failure counts
in their state document instead (etcd_budget.py). A single node (``--nnodes 1``) never uses
this module (its agent counts as it always did).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from xrun.contract import NODE_ID_ENV

from ..store.client import StoreClient
from .api import RendezvousError
from .hosting import StoreLink
from .keys import Keys, World
from .verdict import Verdict, decide

__all__ = [
    "NODE_ID_ENV",
    "Ledger",
    "NodeQuarantinedError",
    "quarantine_key",
    "refusal",
]


def quarantine_key(keys: Keys, nid: str) -> str:
    return f"{keys.prefix}quarantine/{nid}"


class NodeQuarantinedError(RendezvousError):
    """This node is quarantined from the job: it is not readmitted."""


def refusal(nid: str, run_id: str, raw: bytes) -> NodeQuarantinedError:
    host, _, why = raw.decode(errors="replace").partition("\t")
    return NodeQuarantinedError(
        f"node {nid} (host {host}) is quarantined from job {run_id!r} ({why}): it is not "
        f"readmitted; start it under another {NODE_ID_ENV} or on another host"
    )


def lost_value(host: str, rnd: int) -> bytes:
    """What the lost-node lease writes to ``quarantine/<node id>``."""
    return f"{host}\tits agent was lost in round {rnd}".encode()


class Ledger:
    """One node's view of the job's budget and quarantine, on the handler's connection
    (``link.client``); ``rnd``/``index`` are the handler's current round and arrival index.
    Store errors propagate (``StoreError``): the agent treats them as a lost store."""

    def __init__(
        self,
        link: StoreLink,
        keys: Keys,
        nid: str,
        wait_s: float,
        place: Callable[[], tuple[int, int]],
        min_nodes: int = 1,
    ) -> None:
        self._link, self._k, self._place = link, keys, place
        self._min_nodes = min_nodes
        self.node, self.host = nid, socket.gethostname()
        self.qkey = quarantine_key(keys, nid)
        self._wait_s = wait_s
        self._used_key = keys.prefix + "budget/used"
        self._lone_key = f"{keys.prefix}lone/{nid}"

    @property
    def _c(self) -> StoreClient:
        return self._link.client

    def used(self) -> int:
        """The job's failure restarts so far."""
        return int(self._c.add(self._used_key, 0))

    def peer_at_risk(self) -> bool:
        """Did a node report a failure in the current round that could quarantine it (its
        next lone failure would)? Only then do the peers let their workers settle (see
        ``Restarts.settle``): the common case, a first failure, costs the restart nothing."""
        rnd, _ = self._place()
        return rnd >= 0 and self._c.add(self._k.of(rnd, "risk"), 0) > 0

    def failed(self, reason: str, max_restarts: int, restart: Callable[[], None]) -> Verdict:
        """Our workers failed (or stalled) in the current round: count the round's restart
        once for the job and see whether this node failed alone once too often. ``restart``
        asks the peers to restart (before we wait for them to leave the round)."""
        return decide(self, reason, max_restarts, self._min_nodes, restart)

    # -- verdict.Book: the store's keys of the current round -------------------------------------

    def record(self, sig: str) -> int:
        c, k = self._c, self._k
        rnd, index = self._place()
        c.post_set(k.of(rnd, f"fail/{index}"), sig.encode())
        if c.add(k.of(rnd, "failn"), 1) == 1:
            used = c.add(self._used_key, 1)
            c.set(k.of(rnd, "used"), str(used).encode())
            return int(used)
        # another node of the round took the first ticket: its count is ours
        vals = c.wait([k.of(rnd, "used"), k.closed], want_all=False, timeout=self._wait_s)
        return int(vals[0]) if vals and vals[0] is not None else self.used()

    def others(self) -> list[str]:
        """The arrival indices of the current round's other members."""
        rnd, index = self._place()
        raw = self._c.get(self._k.of(rnd, "members"))
        return [i for i in World.parse(rnd, raw).indices if i and i != str(index)] if raw else []

    def serves(self) -> bool:
        return self._link.is_host

    def lone(self) -> int:
        return int(self._c.add(self._lone_key, 0))

    def mark_risk(self) -> None:
        self._c.add(self._k.of(self._place()[0], "risk"), 1)

    def shared(self, others: list[str], sig: str) -> bool | None:
        c, k = self._c, self._k
        rnd, _ = self._place()
        # Each other member reports its failure before it leaves the round, and leaves it only
        # once it stopped its workers: wait for one or the other (the restart request went
        # out already, so the healthy ones are on their way).
        deadline = time.monotonic() + self._wait_s
        for i in others:
            keys = [k.of(rnd, f"fail/{i}"), k.of(rnd, f"left/{i}"), k.closed]
            if not c.wait(keys, want_all=False, timeout=max(0.0, deadline - time.monotonic())):
                return None  # undecided: count nothing against the node
        theirs = c.multi_get([k.of(rnd, f"fail/{i}") for i in others])
        return any(t == sig.encode() for t in theirs)

    def add_lone(self) -> int:
        return int(self._c.add(self._lone_key, 1))

    def quarantine(self, why: str) -> None:
        self._c.set(self.qkey, f"{self.host}\t{why}".encode())
