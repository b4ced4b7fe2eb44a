"""The rendezvous over real loopback sockets: nodes are threads or real subprocesses."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.net import free_port
from xrun.errors import UsageError
from xrun.runtime.rendezvous import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParams,
    RendezvousTimeoutError,
    config_from_conf,
    create_handler,
    parse_endpoint,
    parse_rdzv_conf,
)
from xrun.runtime.store import StoreClient

FAST = {
    "join_timeout": "10",
    "last_call_timeout": "0.3",
    "heartbeat_interval": "0.1",
    "heartbeat_timeout": "0.6",
    "close_timeout": "2",
    "read_timeout": "5",
}

Factory = Callable[..., RendezvousHandler]


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XRUN_RDZV_TOKEN", raising=False)
    monkeypatch.delenv("XRUN_RDZV_TOKEN_FILE", raising=False)


@pytest.fixture
def make() -> Iterator[Factory]:
    """Create handlers (shut down at teardown, hosts last so peers can leave first)."""
    made: list[RendezvousHandler] = []

    def factory(
        endpoint: str = "localhost:0",
        *,
        run_id: str = "job",
        nodes: str = "1:1",
        nproc: int = 1,
        addr: str | None = None,
        backend: str = "c10d",
        node_rank: int = -1,
        **conf: str,
    ) -> RendezvousHandler:
        lo, hi = (int(x) for x in nodes.split(":"))
        h = create_handler(
            RendezvousParams(
                backend,
                endpoint,
                run_id,
                lo,
                hi,
                nproc,
                {**FAST, **conf},
                node_rank=node_rank,
                local_addr=addr,
            )
        )
        made.append(h)
        return h

    yield factory
    for h in sorted(made, key=lambda h: h.is_host):
        h.shutdown()


def rendezvous_all(handlers: list[RendezvousHandler]) -> list[RendezvousInfo]:
    with ThreadPoolExecutor(len(handlers)) as ex:
        return list(ex.map(lambda h: h.next_rendezvous(), handlers))


def wait_event(h: RendezvousHandler, timeout: float) -> tuple[RendezvousEvent, str] | None:
    """What the agent does: select() on fileno(), then poll_event()."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([h.fileno()], [], [], left)[0]:
            ev = h.poll_event()
            if ev is not None:
                return ev
    return None


# -- --rdzv-conf and endpoints -----------------------------------------------------------------


def test_parse_rdzv_conf_accepts_the_documented_keys() -> None:
    conf = parse_rdzv_conf("join_timeout=60, last_call_timeout=5,heartbeat_timeout=20,is_host=0")
    assert conf == {
        "join_timeout": "60",
        "last_call_timeout": "5",
        "heartbeat_timeout": "20",
        "is_host": "0",
    }
    cfg = config_from_conf(conf)
    assert (cfg.join_timeout, cfg.last_call_timeout, cfg.heartbeat_timeout, cfg.is_host) == (
        60.0,
        5.0,
        20.0,
        False,
    )
    assert config_from_conf({}).heartbeat_timeout == 15.0
    assert config_from_conf({"timeout": "7"}).join_timeout == 7.0  # torchrun's static spelling
    # the exit barrier has its own, long default (torchrun's 300 s), not close_timeout's 30 s
    assert config_from_conf({}).exit_barrier_timeout == 300.0
    assert config_from_conf({"exit_barrier_timeout": "2"}).exit_barrier_timeout == 2.0
    assert parse_rdzv_conf("") == {}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("join_timeout=", "join_timeout"),
        ("join_timeout=abc", "join_timeout='abc'"),
        ("last_call_timeout=-1", "last_call_timeout"),
        ("read_timeout=inf", "read_timeout"),
        ("join_timeout", "KEY=VALUE"),
        ("joint_timeout=5", "unknown --rdzv-conf key 'joint_timeout'"),
        ("heartbeat_interval=30", "smaller than heartbeat_timeout"),
        ("is_host=maybe", "is_host"),
        ("token=abc", "command line"),
        ("token_file=", "token_file"),
    ],
)
def test_bad_rdzv_conf_is_a_one_line_usage_error(raw: str, needle: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_rdzv_conf(raw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_create_handler_validates_params() -> None:
    def params(**kw: object) -> RendezvousParams:
        base: dict = dict(
            backend="c10d",
            endpoint="localhost:0",
            run_id="j",
            min_nodes=1,
            max_nodes=1,
            local_world_size=1,
            conf={},
        )
        base.update(kw)
        return RendezvousParams(**base)

    for bad, needle in [
        (params(backend="etcd"), "etcd"),
        (params(min_nodes=3, max_nodes=2), "3:2"),
        (params(run_id=""), "run id"),
        (params(endpoint="host:99999"), "99999"),
        (params(backend="static", max_nodes=2, min_nodes=2, node_rank=2), "--node-rank 2"),
        (params(conf={"join_timeout": "x"}), "join_timeout"),
    ]:
        with pytest.raises(UsageError, match=needle):
            create_handler(bad)


def test_parse_endpoint_forms() -> None:
    assert parse_endpoint("node0:1234") == ("node0", 1234)
    assert parse_endpoint("node0") == ("node0", 29400)
    assert parse_endpoint("[::1]:5") == ("::1", 5)
    assert parse_endpoint("::1") == ("::1", 29400)
    for bad in ("[::1", ":80", "h:port"):
        with pytest.raises(UsageError):
            parse_endpoint(bad)


# -- c10d: forming worlds ------------------------------------------------------------------------


def test_single_node_on_port_zero(make: Factory) -> None:
    h = make(nproc=4)
    assert h.is_host and not h.endpoint.endswith(":0")
    assert h._server is not None and h._server.host == "127.0.0.1"  # not 0.0.0.0
    info = h.next_rendezvous()
    assert (info.round, info.group_rank, info.group_world_size, info.world_size) == (0, 0, 1, 4)
    assert info.local_world_sizes == (4,)


@pytest.mark.parametrize("n", [2, 4])
def test_c10d_threads_get_deterministic_ranks(make: Factory, n: int) -> None:
    names = [f"node-{i}" for i in range(n)]
    # The host has the last name and the others are created in reverse order: ranks follow
    # the advertised names, not who serves the store or who arrives first.
    host = make(nodes=f"{n}:{n}", addr=names[-1], nproc=n)
    hs = [
        host,
        *(
            make(host.endpoint, nodes=f"{n}:{n}", addr=names[i], nproc=i + 1)
            for i in reversed(range(n - 1))
        ),
    ]
    infos = rendezvous_all(hs)
    for h, info in zip(hs, infos, strict=True):
        assert info.group_rank == names.index(h.addr)
        assert info.addrs == tuple(names)
        assert info.local_world_sizes == tuple(range(1, n + 1))
        assert info.rank_offset == sum(range(1, info.group_rank + 1))
        assert info.world_size == n * (n + 1) // 2


NODE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from xrun.runtime.rendezvous import RendezvousParams, create_handler
    ep, run_id, nodes, addr, conf = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
    lo, hi = map(int, nodes.split(":"))
    h = create_handler(RendezvousParams("c10d", ep, run_id, lo, hi, 2, conf, local_addr=addr))
    info = h.next_rendezvous()
    print(json.dumps({"rank": info.group_rank, "size": info.group_world_size,
                      "addrs": info.addrs, "round": info.round}), flush=True)
    if "--linger" in sys.argv:
        time.sleep(60)
    h.finish(5)
    h.shutdown()
    """
)


def spawn_node(
    endpoint: str,
    run_id: str,
    nodes: str,
    addr: str,
    *extra: str,
    conf: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            NODE_SCRIPT,
            endpoint,
            run_id,
            nodes,
            addr,
            json.dumps(conf or FAST),
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(60)
def test_c10d_subprocess_nodes(make: Factory) -> None:
    host = make("127.0.0.1:0", nodes="3:3", addr="b-host")
    procs = [spawn_node(host.endpoint, "job", "3:3", a) for a in ("c-node", "a-node")]
    info = host.next_rendezvous()
    outs = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert info.addrs == ("a-node", "b-host", "c-node") and info.group_rank == 1
    assert [o["rank"] for o in outs] == [2, 0]
    host.finish(5)


def test_ipv6_endpoint(make: Factory) -> None:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            pass
    except OSError:
        # A container without IPv6 loopback: the bracketed form must still fail cleanly.
        with pytest.raises(UsageError, match=r"\[::1\]:0"):
            make("[::1]:0")
        return
    h = make("[::1]:0", nodes="2:2", addr="a")
    peer = make(h.endpoint, nodes="2:2", addr="b")
    assert h.endpoint.startswith("[::1]:") and h._server is not None and h._server.host == "::1"
    assert [i.group_rank for i in rendezvous_all([h, peer])] == [0, 1]


def test_c10d_endpoint_host_serves_and_second_agent_on_host_becomes_client(make: Factory) -> None:
    # Both resolve the endpoint to this host: the first binds the port, the second finds it taken.
    first = make("127.0.0.1:0", nodes="2:2", addr="x")
    second = make(first.endpoint, nodes="2:2", addr="y")
    assert first.is_host and not second.is_host
    assert [i.group_rank for i in rendezvous_all([first, second])] == [0, 1]


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
    a = make(nodes="2:3", addr="a")
    b = make(a.endpoint, nodes="2:3", addr="b")
    victim = spawn_node(a.endpoint, "job", "2:3", "c", "--linger")
    # Let the victim arrive first (python start-up is slower than the 0.3 s last call), so
    # that a and b complete the round to MAX at once.
    watcher = StoreClient(*parse_endpoint(a.endpoint))
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
        watcher = StoreClient(*parse_endpoint(a.endpoint))
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


# -- isolation and backends ----------------------------------------------------------------------


def test_a_second_job_on_the_same_endpoint_is_refused_at_once(make: Factory) -> None:
    # The store dies with the job that hosts it, so job "two" must not come to depend on it.
    a1 = make(nodes="2:2", run_id="one", addr="a1")
    b1 = make(a1.endpoint, nodes="2:2", run_id="one", addr="b1")
    a2 = make(a1.endpoint, nodes="1:1", run_id="two", addr="a2")
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="run id 'one'.*its own --rdzv-endpoint port"):
        a2.next_rendezvous()
    assert time.monotonic() - t0 < 1
    assert [i.addrs for i in rendezvous_all([a1, b1])] == [("a1", "b1")] * 2  # job one is fine


def test_localhost_endpoint_listens_on_loopback_only(make: Factory) -> None:
    h = make("localhost:0")
    port = parse_endpoint(h.endpoint)[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    # 127.0.0.2 is this host too: a wildcard (0.0.0.0) listener would accept it.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_two_standalone_jobs_side_by_side(make: Factory) -> None:
    jobs = [make(run_id=uuid.uuid4().hex, nproc=2) for _ in range(2)]
    assert jobs[0].endpoint != jobs[1].endpoint
    assert [i.world_size for i in rendezvous_all(jobs)] == [2, 2]


def test_static_backend_ranks_come_from_node_rank(make: Factory) -> None:
    ep = f"127.0.0.1:{free_port()}"

    def node(r: int) -> RendezvousInfo:
        h = make(ep, backend="static", nodes="3:3", node_rank=r, addr=f"h{r}", nproc=r + 1)
        assert h.is_host == (r == 0)
        return h.next_rendezvous()

    with ThreadPoolExecutor(3) as ex:
        # Ranks 2 and 1 start first: they retry until rank 0 serves the store.
        futs = [ex.submit(node, 2), ex.submit(node, 1)]
        time.sleep(0.2)
        futs.append(ex.submit(node, 0))
        infos = [f.result(15) for f in futs]
    assert [i.group_rank for i in infos] == [2, 1, 0]
    assert infos[0].addrs == ("h0", "h1", "h2") and infos[0].local_world_sizes == (1, 2, 3)


def test_kv_set_get_add(make: Factory) -> None:
    h = make()
    kv = h.kv()
    publisher = make(h.endpoint).kv()  # e.g. group rank 0 publishing MASTER_ADDR:PORT
    threading.Timer(0.1, publisher.set, args=("master", b"h:1")).start()
    assert kv.get("master", 5) == b"h:1"
    assert kv.add("c", 2) == 2 and kv.add("c", 3) == 5
    with pytest.raises(RendezvousTimeoutError, match="'nope'"):
        kv.get("nope", 0.1)


# -- the job's secret ----------------------------------------------------------------------------


def test_token_from_env_and_file(make: Factory, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XRUN_RDZV_TOKEN", "hunter2")
    host = make(nodes="2:2", addr="a")
    peer = make(host.endpoint, nodes="2:2", addr="b")
    assert [i.group_rank for i in rendezvous_all([host, peer])] == [0, 1]

    monkeypatch.delenv("XRUN_RDZV_TOKEN")
    with pytest.raises(RendezvousError, match="refused"):
        make(host.endpoint, nodes="2:2", run_id="other").next_rendezvous()
    f = tmp_path / "tok"
    f.write_text("hunter2\n")
    monkeypatch.setenv("XRUN_RDZV_TOKEN", "hunter2")
    host2 = make(nodes="2:2", run_id="third", addr="a")
    monkeypatch.delenv("XRUN_RDZV_TOKEN")
    ok = make(
        host2.endpoint, nodes="2:2", run_id="third", addr="b", token_file=str(f), is_host="false"
    )
    assert [i.group_rank for i in rendezvous_all([host2, ok])] == [0, 1]
    monkeypatch.setenv("XRUN_RDZV_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="missing"):
        make(host.endpoint)
