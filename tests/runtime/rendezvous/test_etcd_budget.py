"""etcd_budget.EtcdLedger's rules on a state document held in memory (the handler's
compare-and-set is etcd's; the agents' end-to-end runs are tests/runtime/agent/test_budget.py):
the job-wide budget, and the quarantine of a node whose workers failed alone."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from xrun.runtime.rendezvous.api import RendezvousError
from xrun.runtime.rendezvous.budget import NodeQuarantinedError, refusal
from xrun.runtime.rendezvous.etcd_budget import KEEP_ROUNDS, EtcdLedger, lone_of
from xrun.runtime.rendezvous.etcd_kv import EtcdError
from xrun.runtime.rendezvous.etcd_spares import refuse_quarantined
from xrun.runtime.rendezvous.etcd_state import fresh
from xrun.runtime.rendezvous.verdict import Verdict, signature

HOST = socket.gethostname()
BAD = "local_rank 0 on h failed: RuntimeError: bad batch on rank 1"


def member(agent: str) -> list[Any]:
    return ["127.0.0.1", agent, 1, agent, "", -1, f"node-{agent}"]


class Doc:
    """One job's state document, its live agents, and its nodes' ledgers (agent ``x`` of node
    ``node-x``), all in round ``round`` with ``ids`` as members. ``on_wait`` plays what the
    peers do while a ledger waits for them: a ledger that waits with nothing left to happen
    fails the test (it would wait for join_timeout)."""

    def __init__(self, *ids: str) -> None:
        self.ids = list(ids or ("a", "b"))
        self.state: dict[str, Any] | None = {
            **fresh(0, "", None, []),
            "members": [member(i) for i in self.ids],
            "formed": True,
        }
        self.alive = set(self.ids)
        self.round = 0
        self.restarts = 0
        self.on_wait: list[Callable[[], object]] = []

    # -- etcd_budget.StateDoc ------------------------------------------------------------------

    def look(self) -> tuple[int, dict[str, Any] | None, set[str]]:
        return 0, self.state, set(self.alive)

    def update(self, change: Any) -> dict[str, Any] | None:
        if self.state is None:
            return None
        new = change(self.state)
        if new is not None:
            self.state = new
        return new

    def wait(self, rev: int, timeout: float) -> None:
        assert self.on_wait, "the ledger waited with no peer left to act"
        self.on_wait.pop(0)()

    # -- the handler's part ----------------------------------------------------------------------

    def place(self) -> tuple[int, list[str]]:
        return self.round, list(self.ids)

    def ledger(self, me: str = "a", min_nodes: int = 1, wait_s: float = 30.0) -> EtcdLedger:
        return EtcdLedger(self, self.place, me, f"node-{me}", min_nodes, wait_s)

    def restart(self) -> None:
        """A restart request: the next round, not formed, the job's part carried over."""
        self.restarts += 1
        assert self.state is not None
        if self.state["round"] == self.round:
            self.state = fresh(self.round + 1, "restart", None, [], self.state)

    def arrive(self, agent: str) -> None:
        """``agent`` joins the next round: it is done with the last one."""
        assert self.state is not None
        self.state = {**self.state, "members": [*self.state["members"], member(agent)]}

    def next_round(self) -> None:
        """The round the restart started forms with every live agent: the next attempt."""
        assert self.state is not None
        self.ids = sorted(self.alive)
        members = [member(i) for i in self.ids]
        self.state = {**self.state, "members": members, "formed": True}
        self.round = self.state["round"]


# -- the budget (a fixed-size job of two: min_nodes 2, nobody can be quarantined) ---------------


def test_a_round_that_fails_on_every_node_counts_once() -> None:
    doc = Doc()
    a, b = doc.ledger("a", min_nodes=2), doc.ledger("b", min_nodes=2)
    va = a.failed("RuntimeError: bad", 2, doc.restart)
    vb = b.failed("RuntimeError: bad", 2, doc.restart)
    assert (va.action, va.used, vb.action, vb.used) == ("restart", 1, "restart", 1)
    assert va.line == "restart budget: 1 of 2 restarts used, 1 left (job-wide)"
    assert a.used() == b.used() == 1


def test_rounds_failing_in_turn_spend_the_jobs_budget() -> None:
    doc = Doc()
    a, b = doc.ledger("a", min_nodes=2), doc.ledger("b", min_nodes=2)
    assert a.failed("x", 2, doc.restart).action == "restart"
    doc.next_round()
    assert b.failed("y", 2, doc.restart).action == "restart"  # another node, the same budget
    doc.next_round()
    v = a.failed("x", 2, doc.restart)
    assert (v.action, v.used) == ("spent", 3)
    assert v.line == "restart budget spent: 2 of 2 restarts used (job-wide)"
    assert doc.restarts == 2  # a spent budget asks nobody to restart


def test_the_budget_survives_new_rounds_and_a_node_that_comes_back() -> None:
    doc = Doc()
    doc.ledger(min_nodes=2).failed("x", 5, doc.restart)
    assert doc.state is not None
    doc.state = fresh(2, "a node joined", None, [], doc.state)
    doc.alive = {"a", "c"}  # b left, c (a new agent) came
    doc.next_round()
    assert doc.ledger("c").used() == 1  # a new agent reads the job's count
    assert doc.ledger("c", min_nodes=2).failed("x", 5, doc.restart).used == 2


def test_no_budget_says_nothing_and_etcd_errors_are_rendezvous_errors() -> None:
    doc = Doc()
    v = doc.ledger().failed("x", 0, doc.restart)
    assert (v.action, v.line) == ("spent", "")

    def broken() -> tuple[int, dict[str, Any] | None, set[str]]:
        raise EtcdError("etcd at 127.0.0.1:1 did not answer")

    down = Doc()
    down.look = broken  # type: ignore[method-assign]
    with pytest.raises(RendezvousError, match="did not answer"):
        down.ledger().used()
    with pytest.raises(RendezvousError, match="did not answer"):
        down.ledger().failed("x", 1, down.restart)
    doc.state = None
    with pytest.raises(RendezvousError, match="gone"):
        doc.ledger().failed("x", 1, doc.restart)


def test_before_any_round_nothing_is_counted_and_the_agent_counts_its_own() -> None:
    doc = Doc()
    doc.round = -1
    ledger = doc.ledger()
    with pytest.raises(RendezvousError, match="no rendezvous round"):
        ledger.failed("x", 3, doc.restart)
    assert doc.restarts == 0 and ledger.used() == 0


# -- the lone-failure quarantine (an elastic job: min_nodes 1) ------------------------------------


def test_a_node_failing_alone_twice_is_quarantined_and_refused() -> None:
    """Node a's workers fail while b's run on (b only stops them and rejoins): the first time
    costs a restart, the second quarantines a with c10d's line, and its next agent is refused
    with c10d's refusal, the quarantine carried from round to round."""
    doc = Doc()
    a, b = doc.ledger("a"), doc.ledger("b")
    risk_at_restart: list[int] = []

    def restart() -> None:
        risk_at_restart.append(lone_of(doc.state)["risk"])
        doc.restart()

    doc.on_wait = [lambda: doc.arrive("b")]
    v = a.failed(BAD, 5, restart)
    assert (v.action, v.line) == (
        "restart",
        "restart budget: 1 of 5 restarts used, 4 left (job-wide)",
    )
    assert lone_of(doc.state)["count"] == {"node-a": 1}
    assert not b.peer_at_risk()  # a first failure: the peers stop their workers at once

    doc.next_round()
    doc.on_wait = [lambda: doc.arrive("b")]
    v = a.failed(BAD, 5, restart)
    why = f"its workers failed alone 2 times, last: {BAD}"
    assert (v.action, v.used) == ("quarantined", 2)
    assert v.line == f"node node-a (host {HOST}) quarantined: {why}"
    # the second could quarantine a: marked before the restart request, so that b settles
    assert risk_at_restart == [-1, 1] and b.peer_at_risk()
    assert doc.state is not None
    later = fresh(7, "a node joined", None, [], fresh(6, "restart", None, [], doc.state))
    with pytest.raises(NodeQuarantinedError) as e:
        refuse_quarantined(later, "node-a", "job")
    assert str(e.value) == str(refusal("node-a", "job", f"{HOST}\t{why}".encode()))
    assert f"node node-a (host {HOST}) is quarantined from job 'job' ({why})" in str(e.value)
    refuse_quarantined(later, "node-b", "job")  # the quarantine is node a's alone


def test_the_same_failure_on_every_node_quarantines_nobody() -> None:
    """A bug in the script: both nodes fail alike (their ranks differ) round after round."""
    doc = Doc()
    a, b = doc.ledger("a"), doc.ledger("b")
    theirs: list[Verdict] = []

    def b_fails_alike() -> None:
        theirs.append(b.failed(BAD.replace("rank 1", "rank 0"), 9, doc.restart))

    for rnd in range(KEEP_ROUNDS + 2):
        doc.on_wait = [b_fails_alike]
        v = a.failed(BAD, 9, doc.restart)
        assert (v.action, theirs[-1].action, v.used) == ("restart", "restart", rnd + 1)
        doc.next_round()
    lone = lone_of(doc.state)
    assert lone["count"] == {} and not (doc.state or {})["quarantine"]
    assert len(lone["fails"]) <= KEEP_ROUNDS  # the records of old rounds are dropped


def test_the_same_failure_on_hosts_named_by_letters_quarantines_nobody() -> None:
    """The agent's line names its own host (``local_rank 0 on gpu-a failed: ...``): hosts that
    differ by letters, not digits, must still sign a bug every node hits alike."""
    doc = Doc()
    a, b = doc.ledger("a"), doc.ledger("b")
    a.host, b.host = "gpu-a", "gpu-b"
    why = "local_rank 0 on {} failed: RuntimeError: bad batch"
    theirs: list[Verdict] = []
    for rnd in range(KEEP_ROUNDS + 2):
        doc.on_wait = [lambda: theirs.append(b.failed(why.format("gpu-b"), 9, doc.restart))]
        v = a.failed(why.format("gpu-a"), 9, doc.restart)
        assert (v.action, theirs[-1].action, v.used) == ("restart", "restart", rnd + 1)
        doc.next_round()
    assert lone_of(doc.state)["count"] == {} and not (doc.state or {})["quarantine"]


def test_only_the_failing_nodes_own_host_name_is_blanked() -> None:
    line = "local_rank 0 on {0} failed: connect to {0}.cluster:29500 from gpu-ab refused"
    sig = signature(line.format("gpu-a"), "gpu-a")
    assert sig == signature(line.format("gpu-b"), "gpu-b")
    assert "gpu-ab" in sig and "gpu-a " not in sig and "gpu-a." not in sig


def test_a_peer_failing_differently_or_lost_leaves_the_failure_alone() -> None:
    doc = Doc("a", "b", "c")
    a, b = doc.ledger("a"), doc.ledger("b")
    # b's workers hit a broken collective, c's agent is lost: a's failure is its own
    doc.on_wait = [
        lambda: b.failed("NCCL error: timed out", 9, doc.restart),
        lambda: doc.alive.discard("c"),
    ]
    assert a.failed(BAD, 9, doc.restart).action == "restart"
    assert lone_of(doc.state)["count"] == {"node-a": 1, "node-b": 1}


def test_no_quarantine_where_the_job_needs_the_node_or_the_peers_are_undecided() -> None:
    """A fixed-size job of two (a node fewer than MIN without it) restarts, however often one
    node fails; so does one whose peer neither reported nor left the round in time."""
    doc = Doc()
    for _ in range(3):
        assert doc.ledger("a", min_nodes=2).failed(BAD, 9, doc.restart).action == "restart"
        doc.next_round()
    assert lone_of(doc.state) == {"fails": lone_of(doc.state)["fails"], "count": {}, "risk": -1}
    for _ in range(3):
        assert doc.ledger("a", wait_s=0.0).failed(BAD, 9, doc.restart).action == "restart"
        doc.next_round()
    assert lone_of(doc.state)["count"] == {}


@pytest.mark.parametrize(
    "damage", [{"fails": {"x": {}}}, {"count": {"node-a": "many"}}, {"risk": "soon"}, ["x"]]
)
def test_a_damaged_document_is_a_rendezvous_error_not_the_agents_end(damage: Any) -> None:
    """The agent handles a RendezvousError as a lost store (it counts on its own); anything
    else would end it, and the job with it, for a document it did not write."""
    doc = Doc()
    assert doc.state is not None
    doc.state["lone"] = damage
    with pytest.raises(RendezvousError, match="damaged"):
        doc.ledger("a").failed(BAD, 9, doc.restart)
