"""etcd_budget.EtcdLedger's counting rules on a state document held in memory (the handler's
compare-and-set is etcd's; the agents' end-to-end run is tests/runtime/agent/test_budget.py)."""

from __future__ import annotations

from typing import Any

import pytest

from xrun.runtime.rendezvous.api import RendezvousError
from xrun.runtime.rendezvous.etcd_budget import EtcdLedger
from xrun.runtime.rendezvous.etcd_kv import EtcdError
from xrun.runtime.rendezvous.etcd_state import fresh


class Doc:
    """One job's state document and two nodes' ledgers on it."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = fresh(0, "", None, [])
        self.round = 0
        self.restarts = 0

    def update(self, change: Any) -> dict[str, Any] | None:
        assert self.state is not None
        new = change(self.state)
        if new is not None:
            self.state = new
        return new

    def ledger(self) -> EtcdLedger:
        return EtcdLedger(lambda: self.state, self.update, lambda: self.round)

    def restart(self) -> None:
        self.restarts += 1


def test_a_round_that_fails_on_every_node_counts_once() -> None:
    doc = Doc()
    a, b = doc.ledger(), doc.ledger()
    va = a.failed("RuntimeError: bad", 2, doc.restart)
    vb = b.failed("RuntimeError: bad", 2, doc.restart)
    assert (va.action, va.used, vb.action, vb.used) == ("restart", 1, "restart", 1)
    assert va.line == "restart budget: 1 of 2 restarts used, 1 left (job-wide)"
    assert a.used() == b.used() == 1


def test_rounds_failing_in_turn_spend_the_jobs_budget() -> None:
    doc = Doc()
    a, b = doc.ledger(), doc.ledger()
    assert a.failed("x", 2, doc.restart).action == "restart"
    doc.round = 1
    assert b.failed("y", 2, doc.restart).action == "restart"  # another node, the same budget
    doc.round = 2
    v = a.failed("x", 2, doc.restart)
    assert (v.action, v.used) == ("spent", 3)
    assert v.line == "restart budget spent: 2 of 2 restarts used (job-wide)"
    assert doc.restarts == 2  # a spent budget asks nobody to restart


def test_the_budget_survives_new_rounds_and_a_node_that_comes_back() -> None:
    doc = Doc()
    doc.ledger().failed("x", 5, doc.restart)
    assert doc.state is not None
    doc.state = fresh(1, "restart", None, [], doc.state)  # the round the restart starts
    doc.state = fresh(2, "a node joined", None, [], doc.state)
    doc.round = 2
    assert doc.ledger().used() == 1  # a new agent reads the job's count
    assert doc.ledger().failed("x", 5, doc.restart).used == 2


def test_no_budget_says_nothing_and_etcd_errors_are_rendezvous_errors() -> None:
    doc = Doc()
    v = doc.ledger().failed("x", 0, doc.restart)
    assert (v.action, v.line) == ("spent", "")

    def broken() -> dict[str, Any] | None:
        raise EtcdError("etcd at 127.0.0.1:1 did not answer")

    ledger = EtcdLedger(broken, doc.update, lambda: 0)
    with pytest.raises(RendezvousError, match="did not answer"):
        ledger.used()
    doc.state = None
    with pytest.raises(RendezvousError, match="gone"):
        EtcdLedger(lambda: None, lambda change: None, lambda: 0).failed("x", 1, doc.restart)


def test_before_any_round_nothing_is_counted_and_the_agent_counts_its_own() -> None:
    doc = Doc()
    ledger = EtcdLedger(lambda: doc.state, doc.update, lambda: -1)
    with pytest.raises(RendezvousError, match="no rendezvous round"):
        ledger.failed("x", 3, doc.restart)
    assert doc.restarts == 0 and ledger.used() == 0
