"""One store per job, the listening address, the static backend, the agent's keys and the job's
secret."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.net import free_port
from tests.runtime.rendezvous.helpers import Factory, rendezvous_all
from xrun.errors import UsageError
from xrun.runtime.rendezvous import (
    RendezvousError,
    RendezvousInfo,
    RendezvousTimeoutError,
)

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
    port = h.endpoint.port
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
