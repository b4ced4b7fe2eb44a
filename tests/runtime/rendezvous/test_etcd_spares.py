"""Warm spares on the etcd rendezvous (runtime/rendezvous/etcd_spares.py), handlers side by side
against the suite's real etcd: a spare stands by past join_timeout, takes the slot of a lost
node - group rank 0 included, which c10d cannot replace (its agent serves the store) - the lost
node's next agent is refused, the job's end is not mistaken for a loss, and the spare gets the
modules the active agents publish."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.helpers.waiting import wait_for
from tests.runtime.rendezvous.helpers import FAST, rendezvous_all, wait_event
from xrun.runtime.rendezvous import (
    RendezvousClosedError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParams,
    create_handler,
)
from xrun.runtime.rendezvous.budget import NodeQuarantinedError
from xrun.runtime.rendezvous.endpoint import Endpoint

pytestmark = pytest.mark.timeout(120)

Make = Callable[..., RendezvousHandler]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as ex:
        yield ex


@pytest.fixture
def make(etcd: str, pool: ThreadPoolExecutor) -> Iterator[Make]:
    """Handlers, shut down before ``pool`` joins its threads (a spare standing by in one of
    them sees its handler shut down within its 5 s watch)."""
    made: list[RendezvousHandler] = []

    def factory(run_id: str, node: str, spares: int = 1, **conf: str) -> RendezvousHandler:
        h = create_handler(
            RendezvousParams(
                "etcd", Endpoint.parse(etcd), run_id, 2, 2, 1,
                {**FAST, "heartbeat_timeout": "3", **conf},
                local_addr="127.0.0.1", node_id=node, spares=spares,
            )
        )  # fmt: skip
        made.append(h)
        return h

    yield factory
    for h in made:
        h.shutdown()


def _rid() -> str:
    return f"s{uuid.uuid4().hex[:12]}"  # etcd outlives a test: one job's keys per test


def _standing_by(spare: RendezvousHandler, pool: ThreadPoolExecutor) -> Future[RendezvousInfo]:
    fut = pool.submit(spare.next_rendezvous)
    wait_for(lambda: getattr(spare, "_stood_by", False), timeout=30, what="the spare to stand by")
    return fut


def test_a_spare_takes_group_rank_0_of_a_lost_node_and_its_node_is_refused_after(
    make: Make, pool: ThreadPoolExecutor
) -> None:
    rid = _rid()
    a, b = make(rid, "a"), make(rid, "b")
    first = dict(zip("ab", (i.group_rank for i in rendezvous_all([a, b])), strict=True))
    assert sorted(first.values()) == [0, 1]
    zero = a if first["a"] == 0 else b
    other = b if zero is a else a
    spare = make(rid, "c", join_timeout="1")
    fut = _standing_by(spare, pool)
    time.sleep(2)  # past the spare's join_timeout: it still stands by, the world runs on
    assert not fut.done() and wait_event(other, 0.1) is None
    # group rank 0 is lost: its heartbeats stop (a hung node), its lease runs out (2 s)
    zero._stop.set()  # type: ignore[attr-defined]
    ev = wait_event(other, 10)
    assert ev is not None and ev[0] is RendezvousEvent.RESTART and "was lost" in ev[1]
    again = other.next_rendezvous()
    took = fut.result(timeout=30)
    # the spare has the lost node's slot; the survivor keeps its own
    assert (took.group_rank, again.group_rank) == (0, first["b" if zero is a else "a"])
    assert took.round == again.round == 1 and took.group_world_size == 2
    assert spare.is_host and spare.workers_address[1] > 0  # the workers' store is the spare's
    # the lost node's next agent is refused at its first join, in one line
    lost_node = "a" if zero is a else "b"
    back = make(rid, lost_node)
    with pytest.raises(NodeQuarantinedError, match=f"node {lost_node} .*quarantined from job"):
        back.next_rendezvous()


def test_the_jobs_end_is_not_a_loss_for_a_standing_by_spare(
    make: Make, pool: ThreadPoolExecutor
) -> None:
    rid = _rid()
    a, b = make(rid, "a"), make(rid, "b")
    infos = rendezvous_all([a, b])
    spare = make(rid, "c")
    fut = _standing_by(spare, pool)
    ranks = [i.group_rank for i in infos]
    last = [a, b][ranks.index(1)]  # finishes first and leaves: its lease is revoked at once
    assert last.finish(5) == []
    last.shutdown()
    assert [a, b][ranks.index(0)].finish(10) == []  # the exit barrier: nobody missing
    with pytest.raises(RendezvousClosedError) as err:
        fut.result(timeout=30)
    assert not err.value.failed and "finished" in str(err.value)


def test_without_spares_an_extra_node_still_gives_up_at_join_timeout(make: Make) -> None:
    rid = _rid()
    rendezvous_all([make(rid, "a", spares=0), make(rid, "b", spares=0)])
    extra = make(rid, "c", spares=0, join_timeout="1")
    from xrun.runtime.rendezvous import RendezvousTimeoutError

    with pytest.raises(RendezvousTimeoutError, match="stood by"):
        extra.next_rendezvous()


class _Pool:
    """What the agent's warm pool gives ``warm_spares``: ``share`` is set on it, and
    ``take_modules`` is called with the names a spare gets."""

    def __init__(self) -> None:
        self.share: Callable[[list[str]], None] | None = None
        self.taken: list[str] = []
        self.lock = threading.Lock()

    def take_modules(self, names: list[str]) -> None:
        with self.lock:
            self.taken += names


def test_a_standing_by_spare_gets_the_modules_the_active_agents_publish(
    make: Make, pool: ThreadPoolExecutor
) -> None:
    rid = _rid()
    a, b = make(rid, "a"), make(rid, "b")
    pools = {"a": _Pool(), "b": _Pool(), "c": _Pool()}
    a.warm_spares(pools["a"])
    b.warm_spares(pools["b"])
    ranks = [i.group_rank for i in rendezvous_all([a, b])]
    zero, one = (pools["a"], pools["b"]) if ranks[0] == 0 else (pools["b"], pools["a"])
    spare = make(rid, "c")
    spare.warm_spares(pools["c"])
    fut = _standing_by(spare, pool)
    assert zero.share is not None and one.share is not None
    one.share(["socket"])  # not group rank 0: its lists are not published (rank 0's suffice)
    zero.share(["json", "xml.dom"])  # a list arrives; it never blocks the caller
    wait_for(lambda: pools["c"].taken == ["json", "xml.dom"], timeout=10, what="the modules")
    zero.share(["json", "xml.dom", "csv"])  # only what is new is handed on
    wait_for(lambda: pools["c"].taken == ["json", "xml.dom", "csv"], timeout=10, what="csv")
    assert zero.taken == [] and one.taken == []  # active agents take nothing
    a.close(failed=False, reason="done")  # the job ends: so does the spare's standing by
    with pytest.raises(RendezvousClosedError, match="done"):
        fut.result(timeout=30)


def test_a_worker_failure_leaves_the_spare_standing_by(
    make: Make, pool: ThreadPoolExecutor
) -> None:
    """Every member re-forms after a worker failure: their seats in the new round are theirs,
    even though the spare, waiting next to the world, sees the round first."""
    rid = _rid()
    a, b = make(rid, "a"), make(rid, "b")
    first = {h: i.group_rank for h, i in zip((a, b), rendezvous_all([a, b]), strict=True)}
    spare = make(rid, "c")
    fut = _standing_by(spare, pool)
    a.request_restart("worker 0 failed")
    for h in (a, b):
        ev = wait_event(h, 10)
        assert ev is not None and ev[0] is RendezvousEvent.RESTART
    time.sleep(1)  # the spare has seen the new round (an empty one) by now
    again = {h: i.group_rank for h, i in zip((a, b), rendezvous_all([a, b]), strict=True)}
    assert again == first and not fut.done()
    a.close(failed=False, reason="done")
    with pytest.raises(RendezvousClosedError):
        fut.result(timeout=30)


def test_a_node_lost_while_its_peers_re_form_is_quarantined_too(
    make: Make, pool: ThreadPoolExecutor
) -> None:
    """A survivor's workers fail first (a broken collective) and it asks for the new round
    before the lost node's lease has run out: the round waits for the lost node, which never
    comes; the spare takes its seat and the sealer quarantines it."""
    rid = _rid()
    a, b = make(rid, "a"), make(rid, "b")
    ranks = [i.group_rank for i in rendezvous_all([a, b])]
    spare = make(rid, "c")
    fut = _standing_by(spare, pool)
    a._stop.set()  # type: ignore[attr-defined]  # a is lost (its lease runs out in 3 s)...
    b.request_restart("worker 1 failed: connection reset by peer")  # ...b asks first
    again = b.next_rendezvous()
    took = fut.result(timeout=30)
    assert {again.group_rank, took.group_rank} == {0, 1}
    assert took.group_rank == ranks[0]  # a's slot
    back = make(rid, "a")
    with pytest.raises(NodeQuarantinedError, match="node a .*quarantined"):
        back.next_rendezvous()


def test_an_agent_that_leaves_on_purpose_is_not_quarantined(
    make: Make, pool: ThreadPoolExecutor
) -> None:
    rid = _rid()
    a, b = make(rid, "a"), make(rid, "b")
    rendezvous_all([a, b])
    spare = make(rid, "c")
    fut = _standing_by(spare, pool)
    a.shutdown()  # e.g. SIGTERM to its agent: it leaves mid-round, on purpose
    ev = wait_event(b, 10)
    assert ev is not None and ev[0] is RendezvousEvent.RESTART, ev
    b.next_rendezvous()
    fut.result(timeout=30)
    # its node comes back: not refused; the world is full, so it stands by as a spare
    _standing_by(make(rid, "a"), pool)
    b.close(failed=False, reason="done")
