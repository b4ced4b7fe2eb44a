"""The agent's failure restarts: its own count (one node) or the job's.

``--max-restarts`` is a job-wide budget in a multi-node job: the rounds' failures are counted
once for the job, in the store (c10d, static), where a node that failed alone too often, or
whose agent was lost, is also quarantined (``rendezvous/budget.py`` has the rules), or in etcd's
state document (etcd, etcd-v2: ``rendezvous/etcd_budget.py``).
A single node counts its own restarts exactly as before (same count, same messages).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from xrun.contract import NODE_ID_ENV

from .rendezvous import RendezvousError
from .store.errors import StoreError

if TYPE_CHECKING:
    from .rendezvous import RendezvousHandler
    from .workers.api import PContext, RunProcsResult

# How long a node whose peer failed lets its own workers end on their own (see settle).
SETTLE_S = 1.0

__all__ = ["Restarts", "node_id_for"]


def node_id_for(max_nodes: int, backend: str) -> str:
    """``RendezvousParams.node_id``: set (the job-wide budget, and the quarantine) for a
    multi-node job on a backend that keeps them (an xrun store, etcd); "" (the agent's own
    count) otherwise."""
    if max_nodes <= 1 or backend not in ("c10d", "static", "etcd", "etcd-v2"):
        return ""
    return os.environ.get(NODE_ID_ENV) or socket.gethostname()


class Restarts:
    """How many failure restarts the job used (``used``: the workers'
    ``TORCHELASTIC_RESTART_COUNT``), and what a failed attempt comes to."""

    def __init__(self, max_restarts: int, log: Callable[[str], None]) -> None:
        self.max = max_restarts
        self.used = 0
        self._log = log
        self.line = ""  # the job-wide cause or budget line of the last decision ("": none)
        self.quarantined = False  # this node was quarantined: it leaves, the job goes on

    def spend(self, handler: RendezvousHandler, reason: str) -> bool:
        """A failed (or stalled) attempt: True to restart (a restart counted), False to give up
        (``line`` says why where the job's budget or the quarantine decided it)."""
        ledger = handler.ledger()
        self.line = ""
        if ledger is None:
            if self.used < self.max:
                self.used += 1
                return True
            return False
        try:
            v = ledger.failed(reason, self.max, lambda: handler.request_restart(reason))
        except (StoreError, RendezvousError) as e:  # gone: next_rendezvous tells the rest
            self._log(f"could not count the restart in the job's store ({e})")
            self.used += 1
            return True
        self.used = min(v.used, self.max)
        self.line = v.line
        self.quarantined = v.action == "quarantined"
        return v.action == "restart"

    def settle(self, handler: RendezvousHandler, pc: PContext) -> RunProcsResult | None:
        """A peer asked for a restart: our workers' failure if they failed too (then it is
        reported as ours), else None (stop them). When the peer's request is for a failure
        that could quarantine the peer (the job's ledger marks it this round), our workers get
        ``SETTLE_S`` to end on their own first: a bug every node hits makes them fail within
        moments of each other, and a node that stopped its workers a few ms before they
        failed would leave the peer's failure looking alone (a quarantine for a bug in the
        script). Workers that run on (a bad node's healthy peers) cost that restart that long;
        a peer's first failure costs nothing."""
        done = pc.wait(0)
        ledger = handler.ledger()
        if done is None and ledger is not None:
            with contextlib.suppress(StoreError, RendezvousError):
                if ledger.peer_at_risk():
                    done = pc.wait(SETTLE_S)
        return done if done is not None and done.is_failed() else None

    def sync(self, handler: RendezvousHandler) -> int:
        """After a rendezvous: the job's count (a node that joined late, or whose workers did
        not fail, starts its workers with the same ``TORCHELASTIC_RESTART_COUNT``)."""
        ledger = handler.ledger()
        if ledger is not None:
            with contextlib.suppress(StoreError, RendezvousError):
                self.used = min(ledger.used(), self.max)
        return self.used

    def give_up(self, handler: RendezvousHandler, reason: str) -> str:
        """Leave after a failure with no restart: close the job as failed (the budget is
        spent), or, quarantined, leave it to the others. The line to print first ("" none)."""
        if not self.quarantined:
            why = f"{reason}; {self.line}" if self.line else reason
            with contextlib.suppress(RendezvousError):
                handler.close(failed=True, reason=why)
        return f"xrun-agent: {self.line}\n" if self.line else ""
