"""The etcd rendezvous (``--rdzv-backend etcd`` / ``etcd-v2``) against a real etcd: real agents
with real workers (a 2-node job, elastic scale-up, a lost node, restarts, torch's gloo over the
workers' store), the handlers side by side, and the mistakes a user makes."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import (
    ALLREDUCE,
    BEHAVE,
    agent,
    by_rank,
    check_world,
    events,
    popen,
    run,
)
from tests.runtime.rendezvous.helpers import FAST, rendezvous_all, wait_event
from xrun.errors import UsageError
from xrun.runtime.rendezvous import (
    RendezvousClosedError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousParams,
    RendezvousTimeoutError,
    create_handler,
)
from xrun.runtime.rendezvous.endpoint import Endpoint

# Fast failure detection: etcd's shortest lease is 2 s, so a killed agent is seen in ~2-3 s.
AGENT_FAST = "heartbeat_interval=0.3,heartbeat_timeout=2,last_call_timeout=0.5,join_timeout=30"


@pytest.fixture
def procs() -> object:
    """Agents started with Popen; whatever is still running at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


def _run_id() -> str:
    return f"t{uuid.uuid4().hex[:12]}"  # etcd outlives a test: one job's keys per test


def _common(
    etcd: str, nnodes: str, nproc: int, backend: str = "etcd-v2", conf: str = AGENT_FAST
) -> tuple[str, ...]:
    return (
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        backend,
        "--rdzv-endpoint",
        etcd,
        "--rdzv-id",
        _run_id(),
        "--rdzv-conf",
        conf,
    )


# -- real agents ---------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_two_agents_form_one_world(
    etcd: str, backend: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    common = _common(etcd, "2", 2, backend)
    agents = [popen(procs, agent(*common, BEHAVE, str(tmp_path), "ready")) for _ in range(2)]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    evs = by_rank(events(tmp_path))
    check_world(evs, [2, 2])
    # The workers' store is group rank 0's agent's, not etcd.
    assert {e["MASTER_PORT"] for e in evs.values()} != {etcd.rpartition(":")[2]}


@pytest.mark.timeout(120)
def test_torch_gloo_allreduce_over_the_workers_store(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    common = _common(etcd, "2", 2)
    agents = [popen(procs, agent(*common, ALLREDUCE, str(tmp_path))) for _ in range(2)]
    for a in agents:
        assert a.wait(timeout=100) == 0, a.communicate()[1]
    sums = {json.loads(p.read_text())["sum"] for p in tmp_path.glob("allreduce.*.json")}
    assert len(list(tmp_path.glob("allreduce.*.json"))) == 4 and sums == {10.0}  # 1+2+3+4


@pytest.mark.timeout(90)
def test_elastic_scale_up_restarts_into_a_bigger_world(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    common = _common(etcd, "1:2", 2)
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:4:60")
    first = popen(procs, agent(*common, *actions))
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="first agent's workers")
    alone = events(tmp_path)
    assert {e["WORLD_SIZE"] for e in alone} == {"2"}
    second = popen(procs, agent(*common, *actions))
    assert second.wait(timeout=60) == 0, second.communicate()[1]
    assert first.wait(timeout=60) == 0, first.communicate()[1]
    evs = events(tmp_path)[len(alone) :]
    assert sorted(int(str(e["RANK"])) for e in evs if e["WORLD_SIZE"] == "4") == [0, 1, 2, 3]
    # a membership change is not a failure restart
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in evs} == {"0"}


@pytest.mark.timeout(150)
def test_a_killed_agent_is_dropped_and_the_other_continues(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # A last call long enough for the second agent to start on a busy machine: else the first
    # forms a world alone, its worker (world 1) exits at once and the job is over before the
    # pair forms. The pair seals as soon as both are in (MAX); only the survivor's re-form
    # alone waits it out.
    slow_last_call = AGENT_FAST.replace("last_call_timeout=0.5", "last_call_timeout=8")
    common = _common(etcd, "1:2", 1, conf=slow_last_call)
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:1:60")
    a = popen(procs, agent(*common, *actions))
    b = popen(procs, agent(*common, *actions))
    wait_for(
        lambda: {e["WORLD_SIZE"] for e in events(tmp_path)} == {"2"} and len(events(tmp_path)) == 2,
        what="a two-node world",
        timeout=60,
    )
    # Kill group rank 0's agent, whose store the workers use: with etcd the rendezvous survives.
    rank0_pid = {e["GROUP_RANK"]: e for e in events(tmp_path)}["0"]
    victim, survivor = (a, b) if _is_parent(a.pid, int(str(rank0_pid["pid"]))) else (b, a)
    assert _is_parent(victim.pid, int(str(rank0_pid["pid"])))
    t0 = time.monotonic()
    victim.kill()
    assert survivor.wait(timeout=60) == 0, survivor.communicate()[1]
    # etcd drops it when its lease runs out (2 s), then the survivor re-forms alone after the
    # last call (8 s): well before join_timeout (30 s), which would fail it.
    assert time.monotonic() - t0 < 30
    last = events(tmp_path)[-1]
    assert last["WORLD_SIZE"] == "1"
    assert "lost" in survivor.communicate()[1]


def _is_parent(ppid: int, pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rpartition(")")[2].split()[1]) == ppid


@pytest.mark.timeout(90)
def test_max_restarts_restarts_every_node_once(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    common = _common(etcd, "2", 1)
    # The barrier: a node's restarted workers cannot finish (and its agent leave) while its
    # peer is still re-forming after its own failure.
    actions = (BEHAVE, str(tmp_path), "fail-rank:0", "barrier:2")
    agents = [popen(procs, agent(*common, "--max-restarts", "1", *actions)) for _ in range(2)]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    evs = events(tmp_path)
    # Restart 0 failed (both nodes' local rank 0 raise), restart 1 ran the world again. (A node
    # that saw its peer's restart request before its own worker failed re-forms without counting
    # it, as torchrun does, and may use its one restart a round later: ranks then repeat.)
    assert {int(str(e["RANK"])) for e in evs if e["TORCHELASTIC_RESTART_COUNT"] == "1"} == {0, 1}
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in evs} == {"0", "1"}


@pytest.mark.timeout(90)
def test_restarts_exhausted_fail_the_job_on_every_node(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    common = _common(etcd, "2", 1)
    actions = (BEHAVE, str(tmp_path), "fail-rank-always:0")
    agents = [popen(procs, agent(*common, "--max-restarts", "1", *actions)) for _ in range(2)]
    codes = [a.wait(timeout=60) for a in agents]
    assert codes == [1, 1]
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in events(tmp_path)} == {"0", "1"}


@pytest.mark.timeout(60)
def test_without_an_endpoint_etcd_is_on_this_host(etcd: str, tmp_path: Path) -> None:
    # torchrun's default for the etcd backends: localhost:2379 (the suite's etcd listens there)
    assert etcd.endswith(":2379")
    proc = run(
        agent("--rdzv-backend", "etcd", "--rdzv-id", _run_id(), BEHAVE, str(tmp_path), "ready"),
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert [e["WORLD_SIZE"] for e in events(tmp_path)] == ["1"]


def test_an_endpoint_with_no_etcd_is_one_clear_line() -> None:
    port = free_port()
    proc = run(
        agent(
            "--nnodes",
            "1",
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "x",
            "-m",
            "json.tool",
        ),
        timeout=30,
    )
    assert proc.returncode == 1
    lines = [x for x in proc.stderr.splitlines() if f"127.0.0.1:{port}" in x]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "cannot reach etcd" in lines[0] and "default port 2379" in lines[0]


def test_an_endpoint_that_is_not_etcd_says_so(tmp_path: Path) -> None:
    # An HTTP server that is not etcd (python's own): the line names the fault and the fix.
    port = free_port()
    server = subprocess.Popen(
        ["python3", "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _answers(port), what="the http server")
        proc = run(
            agent(
                "--nnodes",
                "1",
                "--rdzv-backend",
                "etcd-v2",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "json.tool",
            ),
            timeout=30,
        )
    finally:
        server.kill()
        server.wait()
    assert proc.returncode == 1
    assert "is not an etcd v3 server" in proc.stderr and "Traceback" not in proc.stderr


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("conf", "needle"),
    [("protocol=gopher", "protocol='gopher'"), ("etcd_prefix=relative", "etcd_prefix='relative'")],
)
def test_bad_etcd_conf_is_a_usage_error(etcd: str, conf: str, needle: str) -> None:
    proc = run(
        agent(
            "--nnodes",
            "1",
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            etcd,
            "--rdzv-conf",
            conf,
            "-m",
            "json.tool",
        ),
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("xrun")
    assert needle in proc.stderr


def test_the_etcd_script_is_idempotent(etcd: str) -> None:
    from tests.helpers.etcd import SCRIPT

    def etcd_pids() -> set[str]:
        out = subprocess.run(["pgrep", "-x", "etcd"], capture_output=True, text=True).stdout
        return set(out.split())

    before = etcd_pids()
    up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    assert etcd_pids() == before  # one answers already: nothing started
    status = subprocess.run(
        ["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=30
    )
    assert status.returncode == 0 and '"health":"true"' in status.stdout


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture
def tls_etcd(etcd: str, tmp_path: Path) -> object:
    """A second, TLS-only etcd (self-signed certificate for 127.0.0.1): (endpoint, cert)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port, peer = free_port(), free_port()
    proc = subprocess.Popen(
        ["etcd", "--name", "tls", "--data-dir", str(tmp_path / "data")]
        + ["--listen-client-urls", f"https://127.0.0.1:{port}"]
        + ["--advertise-client-urls", f"https://127.0.0.1:{port}"]
        + ["--listen-peer-urls", f"http://127.0.0.1:{peer}"]
        + ["--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"]
        + ["--initial-cluster", f"tls=http://127.0.0.1:{peer}"]
        + ["--cert-file", str(cert), "--key-file", str(key)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _healthy(port, cert), what="the TLS etcd", timeout=30)
        yield f"127.0.0.1:{port}", cert
    finally:
        proc.kill()
        proc.wait()


def _healthy(port: int, cert: Path) -> bool:
    import http.client
    import ssl

    ctx = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=ctx)
    try:
        conn.request("GET", "/health")
        return b'"health":"true"' in conn.getresponse().read()
    except OSError:
        return False
    finally:
        conn.close()


@pytest.mark.timeout(90)
def test_two_agents_over_https(
    tls_etcd: tuple[str, Path], tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    endpoint, cert = tls_etcd
    common = _common(endpoint, "2", 1)
    conf = f"{AGENT_FAST},protocol=https,ca_cert={cert}"
    cmd = agent(*common[:-1], conf, BEHAVE, str(tmp_path / "out"), "ready")
    (tmp_path / "out").mkdir()
    agents = [popen(procs, cmd) for _ in range(2)]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    check_world(by_rank(events(tmp_path / "out")), [1, 1])


def test_https_with_an_untrusted_certificate_is_one_line(tls_etcd: tuple[str, Path]) -> None:
    endpoint, _ = tls_etcd
    proc = run(
        agent("--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint)
        + ["--rdzv-conf", "protocol=https", "-m", "json.tool"],
        timeout=30,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "CERTIFICATE_VERIFY_FAILED" in proc.stderr


def test_https_with_a_missing_ca_file_is_a_usage_error(etcd: str) -> None:
    proc = run(
        agent("--rdzv-backend", "etcd", "--rdzv-endpoint", etcd)
        + ["--rdzv-conf", "protocol=https,cacert=/nonexistent.pem", "-m", "json.tool"],
        timeout=30,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "'/nonexistent.pem'" in proc.stderr


# -- handlers side by side -----------------------------------------------------------------------


@pytest.fixture
def make(etcd: str) -> object:
    made: list[RendezvousHandler] = []

    def factory(
        run_id: str, nodes: str, addr: str, endpoint: str = etcd, **conf: str
    ) -> RendezvousHandler:
        lo, hi = (int(x) for x in nodes.split(":"))
        h = create_handler(
            RendezvousParams(
                "etcd-v2",
                Endpoint.parse(endpoint),
                run_id,
                lo,
                hi,
                1,
                {**FAST, "heartbeat_timeout": "2", **conf},
                local_addr=addr,
            )
        )
        made.append(h)
        return h

    yield factory
    for h in sorted(made, key=lambda h: h.is_host):
        h.shutdown()


def test_a_full_world_keeps_running_and_the_extra_node_stands_by(make: object) -> None:
    rid = _run_id()
    a, b = make(rid, "1:2", "127.0.0.1"), make(rid, "1:2", "127.0.0.1")  # type: ignore[operator]
    infos = rendezvous_all([a, b])
    assert sorted(i.group_rank for i in infos) == [0, 1]
    extra = make(rid, "1:2", "127.0.0.1", join_timeout="1")  # type: ignore[operator]
    with pytest.raises(RendezvousTimeoutError, match="stood by"):
        extra.next_rendezvous()
    assert wait_event(a, 0.5) is None and wait_event(b, 0.5) is None


def test_request_restart_and_close_reach_every_node(make: object) -> None:
    rid = _run_id()
    a, b = make(rid, "2:2", "127.0.0.1"), make(rid, "2:2", "127.0.0.1")  # type: ignore[operator]
    rendezvous_all([a, b])
    a.request_restart("worker 0 failed")
    for h in (a, b):
        ev = wait_event(h, 5)
        assert ev is not None and ev[0] is RendezvousEvent.RESTART and "worker 0 failed" in ev[1]
    r1 = rendezvous_all([a, b])
    assert {i.round for i in r1} == {1}
    b.close(failed=True, reason="out of memory")
    ev = wait_event(a, 5)
    assert ev is not None and ev[0] is RendezvousEvent.CLOSED and "out of memory" in ev[1]
    assert a.closed_failed
    with pytest.raises(RendezvousClosedError, match="out of memory"):
        a.next_rendezvous()


def test_a_finished_node_does_not_disturb_peers_still_running(make: object) -> None:
    rid = _run_id()
    a, b = make(rid, "1:2", "127.0.0.1"), make(rid, "1:2", "127.0.0.1")  # type: ignore[operator]
    infos = rendezvous_all([a, b])
    done = [a, b][[i.group_rank for i in infos].index(1)]
    running = a if done is b else b
    assert done.finish(5) == []
    done.shutdown()  # its lease is revoked: its alive key goes at once
    assert wait_event(running, 3) is None
    assert running.finish(5) == []  # the exit barrier: everyone finished


def test_a_lost_member_ends_the_round_for_the_rest(make: object) -> None:
    rid = _run_id()
    a, b = make(rid, "1:2", "127.0.0.1"), make(rid, "1:2", "127.0.0.1")  # type: ignore[operator]
    rendezvous_all([a, b])
    b._stop.set()  # type: ignore[attr-defined]  # b's heartbeats stop: a hung node
    t0 = time.monotonic()
    ev = wait_event(a, 10)
    assert ev is not None and ev[0] is RendezvousEvent.RESTART and "lost" in ev[1]
    assert time.monotonic() - t0 < 6  # a 2 s lease, renewals every 0.1 s until then
    assert a.next_rendezvous().group_world_size == 1


class _Proxy:
    """A TCP relay to etcd that the test can take down and bring back on the same port."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = free_port()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._socks += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() blocked on it (Linux)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@pytest.mark.timeout(60)
def test_etcd_briefly_away_is_tolerated_and_away_for_good_closes(etcd: str, make: object) -> None:
    proxy = _Proxy(etcd)
    rid = _run_id()
    a = make(rid, "2:2", "127.0.0.1", endpoint=f"127.0.0.1:{proxy.port}")  # type: ignore[operator]
    b = make(rid, "2:2", "127.0.0.1")  # type: ignore[operator]
    rendezvous_all([a, b])
    proxy.down()
    time.sleep(0.8)  # under heartbeat_timeout (2 s): a blip, e.g. an etcd leader election
    proxy.up()
    assert wait_event(a, 2.5) is None and wait_event(b, 0.1) is None
    proxy.down()  # for good
    ev = wait_event(a, 8)
    assert ev is not None and ev[0] is RendezvousEvent.CLOSED and "heartbeat_timeout" in ev[1]
    assert a.closed_failed
    ev = wait_event(b, 8)  # a's lease ran out: b's round ends without it
    assert ev is not None and ev[0] is RendezvousEvent.RESTART and "lost" in ev[1]


def test_the_verdict_expires_and_the_run_id_is_free_again(make: object) -> None:
    rid = _run_id()
    a = make(rid, "1:1", "127.0.0.1", close_timeout="2")  # type: ignore[operator]
    a.next_rendezvous()
    assert a.finish(5) == []
    late = make(rid, "1:1", "127.0.0.1", close_timeout="2")  # type: ignore[operator]
    with pytest.raises(RendezvousClosedError) as e:
        late.next_rendezvous()
    assert not e.value.failed and "finished" in e.value.reason
    time.sleep(3.5)  # the verdict's lease (close_timeout, 2 s) ran out
    again = make(rid, "1:1", "127.0.0.1")  # type: ignore[operator]
    assert again.next_rendezvous().round == 0


def test_port_zero_is_refused() -> None:
    with pytest.raises(UsageError, match="etcd's client"):
        create_handler(RendezvousParams("etcd", Endpoint("127.0.0.1", 0), "j", 1, 1, 1, {}))


@pytest.mark.timeout(150)
def test_a_joiner_waits_for_the_running_world_to_stop(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The etcd twin of the c10d split-brain test (issue #31): a node joining a world with room
    makes it re-form with it, and the new world forms only once the old one's workers stopped
    (here they take 2 s to, four last calls). The joiner used to form a world alone meanwhile:
    two worlds of one job at once, which then kept re-forming each other's world."""
    common = _common(etcd, "1:2", 1)
    # world 1: work until stopped, slowly; world 2: done at once, so both agents exit 0
    actions = (BEHAVE, str(tmp_path), "slow-term:2", "sleep-unless-world:2:60")
    host = popen(procs, agent(*common, *actions))
    wait_for(lambda: len(events(tmp_path)) == 1, what="the first agent's world", timeout=60)
    (alone,) = events(tmp_path)
    other = popen(procs, agent(*common, *actions))
    wait_for(lambda: len(events(tmp_path)) >= 3, what="the next world", timeout=90)
    _, *nxt = events(tmp_path)[:3]
    assert sorted((e["WORLD_SIZE"], e["GROUP_RANK"]) for e in nxt) == [("2", "0"), ("2", "1")], nxt
    stopped = json.loads((tmp_path / f"stopped.{alone['pid']}").read_text())
    assert min(float(str(e["time"])) for e in nxt) > stopped  # one world at a time
    assert other.wait(timeout=60) == 0, other.communicate()[1]
    assert host.wait(timeout=60) == 0, host.communicate()[1]
    assert len(events(tmp_path)) == 3
