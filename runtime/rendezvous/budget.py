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

The etcd backends keep the budget in their state document (etcd_budget.py). A single
node (``--nnodes 1``) never uses this module (its agent counts as it always did).
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable

from xrun.contract import NODE_ID_ENV

from ..store.client import StoreClient
from .api import RendezvousError
from .hosting import StoreLink
from .keys import Keys, World

__all__ = [
    "NODE_ID_ENV",
    "QUARANTINE_AFTER",
    "Ledger",
    "NodeQuarantinedError",
    "Verdict",
    "quarantine_key",
    "refusal",
    "signature",
]

# Alone-failures after which a node is quarantined: one can be bad luck (a flaky read), two in
# one job point at the node.
QUARANTINE_AFTER = 2
_DIGITS = re.compile(r"\d+")


def quarantine_key(keys: Keys, nid: str) -> str:
    return f"{keys.prefix}quarantine/{nid}"


def signature(reason: str) -> str:
    """What two nodes' failures must share to be "the same failure": the root failure's one
    line with its numbers blanked (ranks, pids, addresses differ from node to node)."""
    return _DIGITS.sub("#", reason)[:500]


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


class Verdict:
    """What a failed round comes to for this node: ``action`` is ``restart``, ``spent`` (the
    job's budget is used up: give up, closing the job) or ``quarantined`` (this node leaves:
    the job goes on without it); ``used`` the job's restarts used; ``line`` what to print."""

    __slots__ = ("action", "line", "used")

    def __init__(self, action: str, used: int, line: str) -> None:
        self.action, self.used, self.line = action, used, line


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
        c, k = self._c, self._k
        rnd, index = self._place()
        sig = signature(reason)
        c.post_set(k.of(rnd, f"fail/{index}"), sig.encode())
        if c.add(k.of(rnd, "failn"), 1) == 1:
            used = c.add(self._used_key, 1)
            c.set(k.of(rnd, "used"), str(used).encode())
        else:  # another node of the round took the first ticket: its count is ours
            vals = c.wait([k.of(rnd, "used"), k.closed], want_all=False, timeout=self._wait_s)
            used = int(vals[0]) if vals and vals[0] is not None else self.used()
        if used > max_restarts:  # (no budget, --max-restarts 0: nothing to say about it)
            line = f"restart budget spent: {max_restarts} of {max_restarts} restarts used"
            return Verdict("spent", used, f"{line} (job-wide)" if max_restarts else "")
        # Without this node the job could not form a world again (fewer others than MIN;
        # spares do not count yet), or could not go on at all (this agent serves the store):
        # quarantining it would end a job that has restarts left, for what may be chance (two
        # kill -9s, an OOM). Nothing to count then, and no peer need settle.
        others = self._others(rnd, index)
        needed = self._link.is_host or len(others) < self._min_nodes
        at_risk = int(c.add(f"{k.prefix}lone/{self.node}", 0)) >= QUARANTINE_AFTER - 1
        if at_risk and not needed:
            c.add(k.of(rnd, "risk"), 1)  # before the restart request: the peers settle
        restart()
        lone = 0 if needed else self._alone(rnd, others, sig)
        if lone >= QUARANTINE_AFTER:
            why = f"its workers failed alone {lone} times, last: {reason}"[:300]
            c.set(quarantine_key(k, self.node), f"{self.host}\t{why}".encode())
            return Verdict(
                "quarantined", used, f"node {self.node} (host {self.host}) quarantined: {why}"
            )
        left = max_restarts - used
        return Verdict(
            "restart",
            used,
            f"restart budget: {used} of {max_restarts} restarts used, {left} left (job-wide)",
        )

    def _others(self, rnd: int, index: int) -> list[str]:
        """The arrival indices of round ``rnd``'s other members."""
        raw = self._c.get(self._k.of(rnd, "members"))
        return [i for i in World.parse(rnd, raw).indices if i and i != str(index)] if raw else []

    def _alone(self, rnd: int, others: list[str], sig: str) -> int:
        """This node's count of failures no other member shared, this round's included (0 when
        this one was shared or the round had no other member)."""
        c, k = self._c, self._k
        if not others:
            return 0
        # Each other member reports its failure before it leaves the round, and leaves it only
        # once it stopped its workers: wait for one or the other (the restart request went
        # out already, so the healthy ones are on their way).
        deadline = time.monotonic() + self._wait_s
        for i in others:
            keys = [k.of(rnd, f"fail/{i}"), k.of(rnd, f"left/{i}"), k.closed]
            if not c.wait(keys, want_all=False, timeout=max(0.0, deadline - time.monotonic())):
                return 0  # undecided: count nothing against the node
        theirs = c.multi_get([k.of(rnd, f"fail/{i}") for i in others])
        if any(t == sig.encode() for t in theirs):
            return 0
        return int(c.add(f"{k.prefix}lone/{self.node}", 1))
