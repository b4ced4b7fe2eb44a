"""The job-wide restart budget and the lone-failure quarantine on the etcd rendezvous: c10d's
rules (``verdict.decide``, the reasons in ``budget``) kept in the job's one state document
instead of a store, changed only by compare-and-set and carried from round to round
(``etcd_state.fresh``), so an agent that leaves and comes back resets nothing.

* ``budget``: ``{"used": N, "counted": R}``. A node whose workers failed in round ``r`` counts
  the round unless the document already counted it (``counted >= r``): a restart that every
  node takes together counts once, and every node reads the same ``used``. The budget is spent
  when ``used > max_restarts``; the node that sees it closes the job, as on c10d. A late joiner
  (a spare, a node that came back) reads ``used`` after each round (its workers'
  ``TORCHELASTIC_RESTART_COUNT``).
* ``lone``: ``{"fails": {"<round>": {"<agent id>": mark}}, "count": {"<node id>": n}, "risk":
  R}``. A failing node records its failure's ``mark`` (a digest of ``verdict.signature``: every
  join rewrites the document, and N members' 500-character lines would swell it) under its
  round, in the same write that counts the round; ``fails`` keeps the last ``KEEP_ROUNDS``
  rounds. The failure is alone when, once every other member of the round has recorded one or
  left the round (arrived in a later round, finished, left on purpose, or its lease ended;
  bounded by join_timeout: undecided counts nothing), none recorded the same mark. ``count``
  is per node id, like c10d's ``lone/<node id>``; ``risk``, the last round in which a failure
  could quarantine its node: the peers of that round let their workers settle first.
* A node that failed alone ``verdict.QUARANTINE_AFTER`` times goes into the state's
  ``quarantine`` (``node id -> "host<TAB>why"``, where etcd_spares.py puts a lost node), leaves
  the job, and its next agent is refused at its first join with budget.py's line. No agent
  serves the rendezvous here, so only ``--nnodes`` MIN keeps a node from quarantine.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from .api import RendezvousError
from .etcd_kv import EtcdError
from .verdict import Verdict, decide

State = dict[str, Any]

__all__ = ["KEEP_ROUNDS", "EtcdLedger", "StateDoc", "carry", "lone_of"]

# Rounds whose failure records a document keeps: a node decides on its own round before it
# joins the next, and that round cannot form without it unless it is full; a few spare.
KEEP_ROUNDS = 4
_GONE = "the job's state is gone from etcd"


def carry(last: State | None) -> dict[str, int]:
    """The budget a new round's state inherits from ``last``."""
    b = (last or {}).get("budget") or {}
    return {"used": int(b.get("used", 0)), "counted": int(b.get("counted", -1))}


def lone_of(s: State | None) -> dict[str, Any]:
    """``s``'s lone-failure records, each part present (a document without them has none)."""
    lone = (s or {}).get("lone") or {}
    return {
        "fails": dict(lone.get("fails") or {}),
        "count": dict(lone.get("count") or {}),
        "risk": int(lone.get("risk", -1)),
    }


def _mark(sig: str) -> str:
    import hashlib  # the failure path only: the agent's start-up does without

    return hashlib.blake2b(sig.encode(), digest_size=8).hexdigest()


def _left(s: State, alive: set[str], rnd: int, agent: str) -> bool:
    """Whether ``agent``, a member of round ``rnd``, is done with it: its lease ended, it
    finished or left on purpose, or it arrived in a later round (after reporting a failure of
    ``rnd``, if it had one: the agent reports before it rejoins)."""
    if agent not in alive or agent in s["fin"] or agent in (s.get("left") or ()):
        return True
    return s["round"] > rnd and any(m[3] == agent for m in s["members"])


class StateDoc(Protocol):
    """The job's state document as the ledger uses it (the handler's etcd, or memory)."""

    def look(self) -> tuple[int, State | None, set[str]]:
        """(etcd revision, the state or None once the job is gone, the live agents' ids)."""

    def update(self, change: Callable[[State], State | None]) -> State | None:
        """Compare-and-set the state with ``change`` until it sticks: the state written (None:
        nothing written, or no state)."""

    def wait(self, rev: int, timeout: float) -> None:
        """Return at the job's first change after ``rev``, or after ``timeout`` seconds."""


class EtcdLedger:
    """One node's view of the job's budget and quarantine, on the handler's state document:
    ``place`` gives the node's current round and the agent ids of its members, ``me`` is this
    agent's id, ``node`` its node id. Stateless (each call reads the document); etcd errors
    surface as ``RendezvousError`` (the agent then counts the restart on its own)."""

    def __init__(
        self,
        doc: StateDoc,
        place: Callable[[], tuple[int, list[str]]],
        me: str,
        node: str,
        min_nodes: int = 1,
        wait_s: float = 600.0,
    ) -> None:
        self._doc, self._place, self._me = doc, place, me
        self.node, self.host = node, socket.gethostname()
        self._min_nodes, self._wait_s = min_nodes, wait_s

    def _state(self) -> State | None:
        try:
            return self._doc.look()[1]
        except EtcdError as e:
            raise RendezvousError(f"etcd: {e}") from None

    def used(self) -> int:
        """The job's failure restarts so far."""
        return carry(self._state())["used"]

    def peer_at_risk(self) -> bool:
        """Did a node of our round report a failure that could quarantine it? Only then do the
        peers let their workers settle (``Restarts.settle``)."""
        rnd = self._place()[0]
        return rnd >= 0 and lone_of(self._state())["risk"] == rnd

    def failed(self, reason: str, max_restarts: int, restart: Callable[[], None]) -> Verdict:
        """Our workers failed (or stalled) in the current round: ``verdict.decide`` on the
        state document; ``restart`` asks the peers to restart."""
        if self._place()[0] < 0:  # no round joined: nothing to count against (the agent counts)
            raise RendezvousError("no rendezvous round joined yet")
        try:
            return decide(self, reason, max_restarts, self._min_nodes, restart)
        except EtcdError as e:
            raise RendezvousError(f"etcd: {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            # A document this version did not write (edited by hand, another xrun): the agent
            # then counts its restarts itself, as with a lost store, instead of ending a job
            # whose workers only failed.
            raise RendezvousError(
                f"etcd: the job's budget in its state document is damaged ({e})"
            ) from None

    # -- verdict.Book: the document's ``budget``, ``lone`` and ``quarantine`` -------------------

    def _write(self, change: Callable[[State], State]) -> State:
        new = self._doc.update(change)
        if new is None:
            raise RendezvousError(_GONE)
        return new

    def record(self, sig: str) -> int:
        rnd, mark = self._place()[0], _mark(sig)

        def count(s: State) -> State:
            b, lone = carry(s), lone_of(s)
            if b["counted"] < rnd:  # else a peer counted this round's restart already
                b = {"used": b["used"] + 1, "counted": rnd}
            fails = {r: f for r, f in lone["fails"].items() if int(r) > rnd - KEEP_ROUNDS}
            fails[str(rnd)] = {**fails.get(str(rnd), {}), self._me: mark}
            return {**s, "budget": b, "lone": {**lone, "fails": fails}}

        return carry(self._write(count))["used"]

    def others(self) -> list[str]:
        return [i for i in self._place()[1] if i != self._me]

    def serves(self) -> bool:
        return False  # etcd serves the rendezvous; a round's store host is chosen anew

    def lone(self) -> int:
        return int(lone_of(self._doc.look()[1])["count"].get(self.node, 0))

    def mark_risk(self) -> None:
        rnd = self._place()[0]
        self._write(lambda s: {**s, "lone": {**lone_of(s), "risk": rnd}})

    def shared(self, others: list[str], sig: str) -> bool | None:
        rnd, mark = self._place()[0], _mark(sig)
        deadline = time.monotonic() + self._wait_s
        while True:
            rev, s, alive = self._doc.look()
            if s is None:
                return None
            theirs = lone_of(s)["fails"].get(str(rnd)) or {}
            if s["closed"] is not None or all(
                i in theirs or _left(s, alive, rnd, i) for i in others
            ):
                return any(theirs.get(i) == mark for i in others)
            left = deadline - time.monotonic()
            if left <= 0:
                return None  # undecided: count nothing against the node
            self._doc.wait(rev, left)

    def add_lone(self) -> int:
        def add(s: State) -> State:
            lone = lone_of(s)
            count = {**lone["count"], self.node: int(lone["count"].get(self.node, 0)) + 1}
            return {**s, "lone": {**lone, "count": count}}

        return int(lone_of(self._write(add))["count"][self.node])

    def quarantine(self, why: str) -> None:
        def put(s: State) -> State:
            q = {**(s.get("quarantine") or {}), self.node: f"{self.host}\t{why}"}
            return {**s, "quarantine": q}

        self._write(put)
