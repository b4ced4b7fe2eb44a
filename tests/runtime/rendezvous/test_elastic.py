"""Elasticity: late joiners, full rounds, dead and hung nodes, restarts, closing and leaving."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.net import free_port
from tests.runtime.rendezvous.helpers import (
    FAST,
    Factory,
    rendezvous_all,
    spawn_node,
    wait_event,
)
from xrun.errors import UsageError
from xrun.runtime.rendezvous import (
    RendezvousClosedError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousTimeoutError,
)
from xrun.runtime.store import StoreClient

# -- elasticity ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_late_joiner_restarts_the_round_and_is_included(make: Factory) -> None:
    a = make(nodes="2:3", addr="a")
    b = make(a.endpoint, nodes="2:3", addr="b")
    t0 = time.monotonic()
    r0 = rendezvous_all([a, b])
    # MIN present: the round forms once the last call (0.3 s) passes without a new arrival.
    assert 0.25 < time.monotonic() - t0 < 5
    assert {i.round for i in r0} == {0} and {i.group_world_size for i in r0} == {2}
    assert a.poll_event() is None

    c = make(a.endpoint, nodes="2:3", addr="c")
    with ThreadPoolExecutor(1) as ex:
        late = ex.submit(c.next_rendezvous)
        for h in (a, b):
            ev = wait_event(h, 5)
            assert (
                ev is not None and ev[0] is RendezvousEvent.RESTART and "waiting to join" in ev[1]
            )
        r1 = rendezvous_all([a, b])
        rc = late.result(10)
    assert {i.round for i in [*r1, rc]} == {1}
    assert [i.group_rank for i in [*r1, rc]] == [0, 1, 2]
    assert rc.addrs == ("a", "b", "c")


def test_a_full_round_keeps_running_and_the_extra_node_stands_by(make: Factory) -> None:
    a = make(nodes="1:2", addr="a")
    b = make(a.endpoint, nodes="1:2", addr="b")
    rendezvous_all([a, b])  # MAX reached: formed at once
    extra = make(a.endpoint, nodes="1:2", addr="z", join_timeout="0.5")
    with pytest.raises(RendezvousTimeoutError):
        extra.next_rendezvous()  # no room: it waits, and the running round is not disturbed
    assert a.poll_event() is None and b.poll_event() is None


def _three_with_a_subprocess(
    make: Factory,
) -> tuple[RendezvousHandler, RendezvousHandler, subprocess.Popen[str]]:
    # A last call of 2 s, not FAST's 0.3 s: the round must reach MAX (3) even when the third
    # join comes late on a loaded host (a stress run closed it at 2 and left b waiting for the
    # next round); reaching MAX completes it at once, so the test takes no longer.
    slow = {"last_call_timeout": "2"}
    a = make(nodes="2:3", addr="a", **slow)
    b = make(a.endpoint, nodes="2:3", addr="b", **slow)
    victim = spawn_node(a.endpoint, "job", "2:3", "c", "--linger", conf={**FAST, **slow})
    # Let the victim arrive first (python start-up is slower than a last call), so that a and
    # b complete the round to MAX at once.
    watcher = StoreClient(a.endpoint.host, a.endpoint.port)
    assert watcher.wait(["job/rdzv/0/node/1"], timeout=20) is not None
    watcher.close()
    infos = rendezvous_all([a, b])
    assert json.loads(victim.stdout.readline())["size"] == 3  # type: ignore[union-attr]
    assert infos[0].group_world_size == 3
    return a, b, victim


def _rest_re_form(a: RendezvousHandler, b: RendezvousHandler, within: float) -> float:
    t0 = time.monotonic()
    for h in (a, b):
        ev = wait_event(h, 5)
        assert ev is not None and ev[0] is RendezvousEvent.RESTART and "node c" in ev[1], ev
    elapsed = time.monotonic() - t0
    assert elapsed < within
    again = rendezvous_all([a, b])
    assert [(i.round, i.group_world_size, i.addrs) for i in again] == [(1, 2, ("a", "b"))] * 2
    return elapsed


@pytest.mark.timeout(60)
def test_a_killed_node_is_dropped_at_once_and_the_rest_re_form(make: Factory) -> None:
    a, b, victim = _three_with_a_subprocess(make)
    try:
        victim.send_signal(signal.SIGKILL)  # no goodbye, but the kernel closes its sockets
        victim.wait()
        _rest_re_form(a, b, within=0.5)  # heartbeat_timeout is 0.6 s: this is the closed socket
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.timeout(60)
def test_a_hung_node_is_dropped_after_missed_heartbeats(make: Factory) -> None:
    a, b, victim = _three_with_a_subprocess(make)
    try:
        victim.send_signal(signal.SIGSTOP)  # sockets stay open, heartbeats stop
        elapsed = _rest_re_form(a, b, within=3)
        assert elapsed > 0.3  # heartbeat_timeout=0.6 s, minus at most one 0.1 s interval
    finally:
        victim.kill()
        victim.wait()


def test_request_restart_reaches_every_node(make: Factory) -> None:
    a = make(nodes="2:2", addr="a")
    b = make(a.endpoint, nodes="2:2", addr="b")
    rendezvous_all([a, b])
    b.request_restart("local_rank 0 exited with 1")
    for h in (a, b):
        ev = wait_event(h, 2)
        assert ev == (RendezvousEvent.RESTART, "node b: local_rank 0 exited with 1")
    assert [i.round for i in rendezvous_all([a, b])] == [1, 1]
    assert a.poll_event() is None  # the new round is not stale


def test_close_failed_reaches_peers_as_closed_quickly(make: Factory) -> None:
    a = make(nodes="3:3", addr="a")
    b = make(a.endpoint, nodes="3:3", addr="b")
    c = make(a.endpoint, nodes="3:3", addr="c")
    rendezvous_all([a, b, c])
    t0 = time.monotonic()
    c.close(failed=True, reason="restarts exhausted")
    for h in (a, b):
        ev = wait_event(h, 2)
        assert ev is not None and ev[0] is RendezvousEvent.CLOSED and "restarts exhausted" in ev[1]
    assert time.monotonic() - t0 < 1
    assert a.closed_failed and b.closed_failed
    with pytest.raises(RendezvousClosedError) as e:
        a.next_rendezvous()
    assert e.value.failed and "restarts exhausted" in e.value.reason


def test_closed_as_finished_is_not_a_failure(make: Factory) -> None:
    a = make(nodes="2:2", addr="a")
    b = make(a.endpoint, nodes="2:2", addr="b")
    rendezvous_all([a, b])
    a.close(failed=False, reason="all done")
    ev = wait_event(b, 2)
    assert ev == (RendezvousEvent.CLOSED, "node a: all done") and not b.closed_failed


def test_finish_verdict_survives_the_store_going_away(make: Factory) -> None:
    # The host's exit barrier runs out under b (still working) and it stops serving: b must read
    # "did not finish" with failed=True, not a bare "lost the store".
    a = make(nodes="2:2", addr="a", exit_barrier_timeout="0.3", close_timeout="0.2")
    b = make(a.endpoint, nodes="2:2", addr="b")
    rendezvous_all([a, b])
    b.fileno()  # b's watch is armed, as while its workers run
    assert a.finish() == ["b"]
    a.shutdown()
    ev = wait_event(b, 2)
    assert ev is not None and ev[0] is RendezvousEvent.CLOSED, ev
    assert "did not finish within exit_barrier_timeout=0.3s" in ev[1] and b.closed_failed


def test_closed_while_waiting_to_join(make: Factory) -> None:
    a = make(nodes="3:3", addr="a")
    b = make(a.endpoint, nodes="3:3", addr="b")
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.next_rendezvous)
        time.sleep(0.2)
        b.close(failed=True, reason="bye")
        with pytest.raises(RendezvousClosedError, match="bye"):
            fut.result(5)


def test_join_timeout(make: Factory) -> None:
    h = make(nodes="2:2", join_timeout="0.5")
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match="join_timeout=0.5"):
        h.next_rendezvous()
    assert 0.45 < time.monotonic() - t0 < 3


def test_unreachable_endpoint_times_out(make: Factory) -> None:
    # Nobody serves this port and this agent is told not to: it retries, then gives up.
    h = make(f"127.0.0.1:{free_port()}", join_timeout="0.5", is_host="false")
    with pytest.raises(RendezvousTimeoutError, match=str(h.endpoint)):
        h.next_rendezvous()


def test_port_in_use_for_static_rank0_is_a_usage_error(make: Factory) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(UsageError, match=f"127.0.0.1:{port}.*pick a free port"):
            make(f"127.0.0.1:{port}", backend="static", nodes="2:2", node_rank=0)


def test_a_node_dying_before_the_round_forms_does_not_hang_it(make: Factory) -> None:
    # 2:3 nodes with a 30 s last call; the node that arrives second dies before the third comes:
    # its closed connection marks the forming round stale, so the round forms at once (already
    # stale) and the survivors re-form without it instead of sitting out the last call.
    a = make(nodes="2:3", addr="a", last_call_timeout="30")
    b = make(a.endpoint, nodes="2:3", addr="b", last_call_timeout="30")
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.next_rendezvous)
        watcher = StoreClient(a.endpoint.host, a.endpoint.port)
        assert watcher.wait(["job/rdzv/0/node/1"], timeout=5) is not None
        dead = spawn_node(a.endpoint, "job", "2:3", "dead", "--linger")
        assert watcher.wait(["job/rdzv/0/node/2"], timeout=20) is not None
        dead.kill()
        dead.wait()
        t0 = time.monotonic()
        first = fut.result(10)
        assert time.monotonic() - t0 < 5  # not the 30 s last call
    assert first.addrs == ("a", "dead")
    ev = wait_event(a, 2)
    assert ev is not None and ev[0] is RendezvousEvent.RESTART and "dead" in ev[1]
    watcher.close()
    c = make(a.endpoint, nodes="2:3", addr="c")  # MAX again: no need to sit out the last call
    again = rendezvous_all([a, b, c])
    assert [i.addrs for i in again] == [("a", "b", "c")] * 3


def test_finish_leaves_together_and_closes_the_job(make: Factory) -> None:
    a = make(nodes="2:2", addr="a")
    b = make(a.endpoint, nodes="2:2", addr="b")
    rendezvous_all([a, b])
    with ThreadPoolExecutor(1) as ex:
        host_done = ex.submit(a.finish, 10)  # the host waits for b
        time.sleep(0.3)
        assert not host_done.done()
        b.finish(10)
        host_done.result(5)
    late = make(a.endpoint, nodes="2:2", addr="late")
    with pytest.raises(RendezvousClosedError) as e:
        late.next_rendezvous()
    assert not e.value.failed


def test_a_finished_node_does_not_disturb_peers_still_running(make: Factory) -> None:
    a = make(nodes="2:2", addr="a")
    b = make(a.endpoint, nodes="2:2", addr="b")
    rendezvous_all([a, b])
    time.sleep(0.25)  # heartbeats (every 0.1 s) are flowing on b's watch connection
    b.finish(5)
    b.shutdown()  # its connections close: its leases were released, so nothing fires
    assert wait_event(a, 1.0) is None  # > heartbeat_timeout (0.6 s): no lease was revived


@pytest.mark.timeout(60)
def test_finish_does_not_wait_for_a_dead_peer(make: Factory) -> None:
    a, b, victim = _three_with_a_subprocess(make)
    victim.kill()
    victim.wait()
    b.finish(30)
    t0 = time.monotonic()
    a.finish(30)  # the host: b is done, c is gone (its connection closed)
    assert time.monotonic() - t0 < 2
    late = make(a.endpoint, nodes="2:3", addr="late")
    with pytest.raises(RendezvousClosedError, match="c did not finish") as e:
        late.next_rendezvous()
    assert e.value.failed


def test_shutdown_mid_round_makes_peers_restart(make: Factory) -> None:
    a = make(nodes="1:2", addr="a")
    b = make(a.endpoint, nodes="1:2", addr="b")
    rendezvous_all([a, b])
    b.shutdown()
    ev = wait_event(a, 2)
    assert ev is not None and ev[0] is RendezvousEvent.RESTART
