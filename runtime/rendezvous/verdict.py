"""What a failed round comes to for one node of a multi-node job: the job-wide restart budget's and
the lone-failure quarantine's rules, written once for every backend that keeps them.

A backend keeps the job's ledger where its rendezvous lives (``budget.Ledger``: c10d and static,
in the rendezvous store; ``etcd_budget.EtcdLedger``: etcd, in the job's state document) and
supplies its few reads and writes as a ``Book``; in which order they happen, and what they come
to, is ``decide``'s alone. The rules' reasons are in budget.py's docstring; in short:

* a failed round costs the job one restart however many nodes failed in it, and the job's budget
  is spent when ``used > max_restarts``;
* a failure is *alone* when no other member of the round reported the same ``signature``; a node
  whose workers failed alone ``QUARANTINE_AFTER`` times is quarantined (it leaves, and its next
  agent is refused), unless the job cannot do without it (fewer other members than ``--nnodes``
  MIN, or its agent serves the rendezvous);
* a failure that could quarantine its node is marked before the restart request, so that the
  peers let their own workers settle first (``Restarts.settle``): a bug every node hits is then
  seen as shared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

__all__ = ["QUARANTINE_AFTER", "Book", "Verdict", "decide", "signature"]

# Alone-failures after which a node is quarantined: one can be bad luck (a flaky read), two in
# one job point at the node.
QUARANTINE_AFTER = 2
_DIGITS = re.compile(r"\d+")


def signature(reason: str, host: str = "") -> str:
    """What two nodes' failures must share to be "the same failure": the root failure's one
    line with its numbers and the failing node's own ``host`` name blanked (ranks, pids,
    addresses and host names differ from node to node: ``gpu-a`` and ``gpu-b`` failing alike
    is a bug every node hits, not two nodes each failing alone)."""
    if host:
        reason = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", "<host>", reason)
    return _DIGITS.sub("#", reason)[:500]


class Verdict:
    """What a failed round comes to for this node: ``action`` is ``restart``, ``spent`` (the
    job's budget is used up: give up, closing the job) or ``quarantined`` (this node leaves:
    the job goes on without it); ``used`` the job's restarts used; ``line`` what to print."""

    __slots__ = ("action", "line", "used")

    def __init__(self, action: str, used: int, line: str) -> None:
        self.action, self.used, self.line = action, used, line


class Book(Protocol):
    """One node's reads and writes of the job's ledger in the round it is in; a backend's
    errors propagate (the agent then counts the restart on its own)."""

    node: str  # the node id the quarantine keys on (budget.py, "Node id")
    host: str  # what the quarantine's lines name besides it

    def record(self, sig: str) -> int:
        """Report this node's failure of the round (``sig``) and count the round once for the
        job: the job's restarts used, this round's included."""

    def others(self) -> list[str]:
        """The round's other members (as ``shared`` takes them)."""

    def serves(self) -> bool:
        """Whether this agent serves the rendezvous: the job would end with it."""

    def lone(self) -> int:
        """This node's lone failures so far."""

    def mark_risk(self) -> None:
        """Mark the round: a failure in it could quarantine its node (the peers settle)."""

    def shared(self, others: list[str], sig: str) -> bool | None:
        """Wait (bounded) until each of ``others`` reported its failure of the round or left
        the round, then whether one reported ``sig``; None when that is not known in time."""

    def add_lone(self) -> int:
        """Count one more lone failure against this node: its count now."""

    def quarantine(self, why: str) -> None:
        """Keep this node out of the job: its next agent is refused, naming ``why``."""


def decide(
    book: Book, reason: str, max_restarts: int, min_nodes: int, restart: Callable[[], None]
) -> Verdict:
    """This node's workers failed (or stalled) in ``book``'s round for ``reason``: count the
    round for the job, ask the peers to restart (``restart``) unless the budget is spent, and see
    whether this node failed alone once too often."""
    sig = signature(reason, book.host)
    used = book.record(sig)
    if used > max_restarts:  # (no budget, --max-restarts 0: nothing to say about it)
        line = f"restart budget spent: {max_restarts} of {max_restarts} restarts used"
        return Verdict("spent", used, f"{line} (job-wide)" if max_restarts else "")
    # Without this node the job could not form a world again (fewer others than MIN; spares do
    # not count yet), or could not go on at all (its agent serves the rendezvous): quarantining
    # it would end a job that has restarts left, for what may be chance (two kill -9s, an OOM).
    # Nothing to count then, and no peer need settle.
    others = book.others()
    exempt = book.serves() or len(others) < min_nodes
    if not exempt and book.lone() >= QUARANTINE_AFTER - 1:
        book.mark_risk()  # before the restart request: the peers settle
    restart()
    if not exempt and others and book.shared(others, sig) is False:
        lone = book.add_lone()
        if lone >= QUARANTINE_AFTER:
            why = f"its workers failed alone {lone} times, last: {reason}"[:300]
            book.quarantine(why)
            line = f"node {book.node} (host {book.host}) quarantined: {why}"
            return Verdict("quarantined", used, line)
    left = max_restarts - used
    return Verdict(
        "restart",
        used,
        f"restart budget: {used} of {max_restarts} restarts used, {left} left (job-wide)",
    )
