"""The job-wide restart budget on the etcd rendezvous (see ``budget`` for c10d's).

``--max-restarts`` counts for the whole job here too, not per agent: the count lives in the
job's one state document (``budget``: ``{"used": N, "counted": R}``), changed only by
compare-and-set, and carried from round to round (``etcd_state.fresh``), so an agent that
leaves and comes back cannot reset it.

* **One restart per failed round.** A node whose workers failed in round ``r`` counts the
  round unless the document already counted it (``counted >= r``): a restart that every node
  takes together (a bug every rank hits) counts once, and every node reads the same ``used``.
  The budget is spent when ``used > max_restarts``; the node that sees it closes the job, as on
  c10d.
* **A late joiner** (a spare, a node that came back) reads ``used`` after each round (its
  workers' ``TORCHELASTIC_RESTART_COUNT``).

What c10d adds and this does not: the quarantine of a node whose workers failed *alone* twice
(``budget.QUARANTINE_AFTER``) needs each member's failure signature and an arrival-indexed
round; here a lost node is quarantined with ``--spares`` (``etcd_spares``) and a node that
keeps failing spends the job's budget instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import RendezvousError
from .budget import Verdict
from .etcd_kv import EtcdError

State = dict[str, Any]

__all__ = ["EtcdLedger", "carry"]


def carry(last: State | None) -> dict[str, int]:
    """The budget a new round's state inherits from ``last``."""
    b = (last or {}).get("budget") or {}
    return {"used": int(b.get("used", 0)), "counted": int(b.get("counted", -1))}


class EtcdLedger:
    """One node's view of the job's budget, on the handler's state document: ``read`` gives the
    state (None once the job is gone), ``update(change)`` compare-and-sets it (``change`` may
    return None: nothing to write), ``place`` the node's current round. etcd errors surface as
    ``RendezvousError`` (the agent then counts the restart on its own)."""

    def __init__(
        self,
        read: Callable[[], State | None],
        update: Callable[[Callable[[State], State | None]], State | None],
        place: Callable[[], int],
    ) -> None:
        self._read, self._update, self._place = read, update, place

    def used(self) -> int:
        """The job's failure restarts so far."""
        try:
            s = self._read()
        except EtcdError as e:
            raise RendezvousError(f"etcd: {e}") from None
        return carry(s)["used"]

    def peer_at_risk(self) -> bool:
        """No lone-failure quarantine here (see the module docstring): no peer need settle."""
        return False

    def failed(self, reason: str, max_restarts: int, restart: Callable[[], None]) -> Verdict:
        """Our workers failed (or stalled) in the current round: count the round once for the
        job; ``restart`` asks the peers to restart when the budget has a restart left."""
        rnd = self._place()
        if rnd < 0:  # no round joined: nothing to count against (the agent counts its own)
            raise RendezvousError("no rendezvous round joined yet")

        def count(s: State) -> State | None:
            b = carry(s)
            if b["counted"] >= rnd:
                return None  # a peer counted this round's restart already
            return {**s, "budget": {"used": b["used"] + 1, "counted": rnd}}

        try:
            new = self._update(count)
            s = new if new is not None else self._read()
        except EtcdError as e:
            raise RendezvousError(f"etcd: {e}") from None
        if s is None:
            raise RendezvousError("the job's state is gone from etcd")
        used = carry(s)["used"]
        if used > max_restarts:  # (--max-restarts 0: no budget, nothing to say about it)
            line = f"restart budget spent: {max_restarts} of {max_restarts} restarts used"
            return Verdict("spent", used, f"{line} (job-wide)" if max_restarts else "")
        restart()
        left = max_restarts - used
        return Verdict(
            "restart",
            used,
            f"restart budget: {used} of {max_restarts} restarts used, {left} left (job-wide)",
        )
