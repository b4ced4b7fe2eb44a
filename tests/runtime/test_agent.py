"""The elastic agent end to end: real agents (`python -m xrun.runtime`), real workers, loopback.

The workers run tests/scripts/behave.py (standard library only, so no test pays for a torch
import except the gloo all_reduce one). Each worker appends its env to <out>/events.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import PY, SCRIPTS
from tests.helpers.waiting import wait_for

BEHAVE = str(SCRIPTS / "behave.py")
ALLREDUCE = str(SCRIPTS / "allreduce.py")
PROBE = str(SCRIPTS / "probe_agent_store.py")
SECRET_ENV = ("XRUN_RDZV_TOKEN", "XRUN_RDZV_TOKEN_FILE")
# Fast failure detection for the multi-agent tests (defaults are 5 s / 15 s / 30 s).
FAST = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=0.5,join_timeout=30"


def agent(*args: str) -> list[str]:
    return [PY, "-m", "xrun.runtime", *args]


def run(cmd: list[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
    )  # type: ignore[call-overload]


def events(out: Path) -> list[dict[str, object]]:
    path = out / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists": look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Agents started with Popen; whatever is still running at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


def popen(
    procs: list[subprocess.Popen[str]], cmd: list[str], **kw: object
) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        **kw,
    )  # type: ignore[call-overload]
    procs.append(p)
    return p


def by_rank(evs: list[dict[str, object]], restart: str = "0") -> dict[int, dict[str, object]]:
    return {int(str(e["RANK"])): e for e in evs if e["TORCHELASTIC_RESTART_COUNT"] == restart}


def check_world(evs: dict[int, dict[str, object]], nprocs: list[int]) -> None:
    """Ranks are contiguous per node, in group-rank order; sizes agree everywhere."""
    world = sum(nprocs)
    assert sorted(evs) == list(range(world))
    offsets = [sum(nprocs[:g]) for g in range(len(nprocs))]
    ports = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in evs.values()}
    assert len(ports) == 1, ports  # one workers' store per round
    for rank, e in evs.items():
        g = int(str(e["GROUP_RANK"]))
        lr = int(str(e["LOCAL_RANK"]))
        assert rank == offsets[g] + lr
        assert e["LOCAL_WORLD_SIZE"] == str(nprocs[g])
        assert e["WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == str(world)
        assert e["GROUP_WORLD_SIZE"] == str(len(nprocs))
        assert e["ROLE_RANK"] == str(rank)
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def two_agents(
    procs: list[subprocess.Popen[str]],
    nprocs: tuple[int, int],
    out: Path,
    actions: list[str],
    extra: tuple[str, ...] = (),
    nnodes: str = "2",
) -> list[subprocess.Popen[str]]:
    port = free_port()
    return [
        popen(
            procs,
            agent(
                "--nnodes",
                nnodes,
                "--nproc-per-node",
                str(n),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "job",
                "--rdzv-conf",
                FAST,
                *extra,
                BEHAVE,
                str(out),
                *actions,
            ),
        )
        for n in nprocs
    ]


# -- ranks and env -------------------------------------------------------------------------------


def test_standalone_1x2_env(tmp_path: Path) -> None:
    p = run(agent("--nproc-per-node", "2", "--max-restarts", "3", BEHAVE, str(tmp_path)))
    assert p.returncode == 0, p.stderr
    evs = by_rank(events(tmp_path))
    check_world(evs, [2])
    e = evs[1]
    assert e["TORCHELASTIC_MAX_RESTARTS"] == "3" and e["OMP_NUM_THREADS"] == "1"
    assert e["MASTER_ADDR"] and 0 < int(str(e["MASTER_PORT"])) < 65536
    assert str(e["TORCHELASTIC_ERROR_FILE"]).endswith("/attempt_0/1/error.json")


@pytest.mark.parametrize("nprocs", [(2, 2), (1, 3)], ids=["2x2", "1+3"])
def test_two_agents_env(
    tmp_path: Path, procs: list[subprocess.Popen[str]], nprocs: tuple[int, int]
) -> None:
    agents = two_agents(procs, nprocs, tmp_path, [])
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    evs = by_rank(events(tmp_path))
    # group ranks are deterministic but not tied to start order: read each node's size back
    sizes = {int(str(e["GROUP_RANK"])): int(str(e["LOCAL_WORLD_SIZE"])) for e in evs.values()}
    assert sorted(sizes.values()) == sorted(nprocs)
    check_world(evs, [sizes[0], sizes[1]])
    assert {e["TORCHELASTIC_RUN_ID"] for e in evs.values()} == {"job"}


def test_two_agents_over_ipv6(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    """`--rdzv-endpoint [::1]:PORT`: the store serves and the agents join over IPv6."""
    port = free_port()
    agents = [
        popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"[::1]:{port}",
                "--rdzv-id",
                "v6",
                "--rdzv-conf",
                FAST,
                BEHAVE,
                str(tmp_path),
            ),
        )
        for _ in range(2)
    ]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    check_world(by_rank(events(tmp_path)), [1, 1])


@pytest.mark.timeout(120)
def test_gloo_all_reduce_across_two_agents(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    agents = [
        popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "gloo",
                ALLREDUCE,
                str(tmp_path),
            ),
        )
        for _ in range(2)
    ]
    for a in agents:
        assert a.wait(timeout=100) == 0, a.communicate()[1]
    results = sorted(
        (json.loads(f.read_text()) for f in tmp_path.glob("allreduce.*.json")),
        key=lambda r: r["rank"],
    )
    # ranks contribute rank+1: 1 + 2 = 3 on both
    assert results == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]


def test_static_backend(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    agents = [
        popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(r),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                BEHAVE,
                str(tmp_path),
            ),
        )
        for r in (1, 0)  # the non-host starts first: it must wait for the store
    ]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    evs = by_rank(events(tmp_path))
    check_world(evs, [2, 2])
    # --node-rank decides the group rank
    assert {e["GROUP_RANK"] for r, e in evs.items() if r < 2} == {"0"}


# -- failures and restarts -----------------------------------------------------------------------


def test_failure_then_restart_counts(tmp_path: Path) -> None:
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            BEHAVE,
            str(tmp_path),
            "barrier:2",
            "fail-rank:1",
        )
    )
    assert p.returncode == 0, p.stderr
    evs = events(tmp_path)
    assert sorted((e["RANK"], e["TORCHELASTIC_RESTART_COUNT"]) for e in evs) == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    errs = sorted(str(e["TORCHELASTIC_ERROR_FILE"]) for e in evs if e["RANK"] == "1")
    assert errs[0].endswith("attempt_0/1/error.json") and errs[1].endswith("attempt_1/1/error.json")


def test_restarts_exhausted_summary_and_error_files(tmp_path: Path) -> None:
    own = tmp_path / "agent_error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(own)}
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
            BEHAVE,
            str(tmp_path),
            "barrier:2",
            "fail-rank-always:1",
            "sleep:30",
        ),
        env=env,
    )
    assert p.returncode == 1
    err = p.stderr
    assert "Root Cause (first observed failure):" in err and "Failures:" in err
    root = err.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "exitcode  : 1" in root
    # the @record error file's traceback is shown, and its path
    assert "RuntimeError: scripted failure of rank 1" in root and 'behave.py", line' in root
    worker_err = next((tmp_path / "logs").glob("*/attempt_1/1/error.json"))
    assert f"error_file: {worker_err}" in root
    # two attempts ran; the surviving rank 0 (sleeping) was stopped, not left behind
    assert len(events(tmp_path)) == 4
    for e in events(tmp_path):
        assert not alive(int(str(e["pid"])))
    # the agent's own error file: the root cause, with the worker's exit code
    doc = json.loads(own.read_text())
    assert doc["message"]["message"] == "RuntimeError: scripted failure of rank 1"
    assert doc["message"]["errorCode"] == 1
    assert "py_callstack" in doc["message"]["extraInfo"]
    # the worker wrote its own error file, not the agent's
    assert json.loads(worker_err.read_text())["message"]["message"].startswith("RuntimeError")
    # logs, tracebacks and error files are the user's alone
    run_dir = worker_err.parents[2]
    for d in (tmp_path / "logs", run_dir, run_dir / "attempt_0", worker_err.parent):
        assert oct(d.stat().st_mode & 0o777) == "0o700", d
    for f in (own, worker_err):
        assert oct(f.stat().st_mode & 0o777) == "0o600", f


def test_signal_death_summary_without_error_file(tmp_path: Path) -> None:
    own = tmp_path / "agent_error.json"
    p = run(
        agent("--nproc-per-node", "1", BEHAVE, str(tmp_path), "kill-rank:0"),
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(own)},
    )
    assert p.returncode == 1
    assert "exitcode  : -9" in p.stderr and "(SIGKILL)" in p.stderr
    assert "error_file: <N/A>" in p.stderr
    doc = json.loads(own.read_text())
    assert doc["message"]["errorCode"] == -9 and "SIGKILL" in doc["message"]["message"]


def test_peer_failure_stops_the_other_agent_promptly(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path
    port = free_port()
    common = (
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "j",
        "--rdzv-conf",
        FAST,
    )
    sleeper = popen(procs, agent(*common, BEHAVE, str(out), "ready", "sleep:60"))
    failer = popen(procs, agent(*common, BEHAVE, str(out), "ready", "sleep:0.5", "exit-rank:0:3"))
    assert failer.wait(timeout=60) == 1
    t0 = time.monotonic()
    assert sleeper.wait(timeout=10) == 1
    assert time.monotonic() - t0 < 5
    err = sleeper.communicate()[1]
    assert "closed by a peer" in err and "exited with code 3" in err, err
    for e in events(out):
        assert not alive(int(str(e["pid"])))


def _host_then_peer(
    procs: list[subprocess.Popen[str]], out: Path, conf: str, peer_sleep: float
) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Two agents whose workers run behave.py sleep-env: the first serves the store and its
    workers end at once; the second's workers sleep ``peer_sleep`` s."""
    port = free_port()
    common = (
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "barrier",
        "--rdzv-conf",
        f"{FAST},{conf}",
        BEHAVE,
        str(out),
        "sleep-env:XRUN_TEST_SLEEP",
    )
    host = popen(procs, agent(*common))
    wait_for(lambda: _serving(port), what="the first agent's rendezvous store")
    peer = popen(procs, agent(*common), env={**os.environ, "XRUN_TEST_SLEEP": str(peer_sleep)})
    return host, peer


@pytest.mark.timeout(60)
def test_exit_barrier_outlasts_close_timeout_for_a_slow_peer(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # The store's host is done ~3 s before its peer: far beyond close_timeout, well within the
    # exit barrier. Both succeed: a slow node is not a failed node.
    host, peer = _host_then_peer(procs, tmp_path, "close_timeout=0.5", peer_sleep=3)
    assert peer.wait(timeout=40) == 0, peer.communicate()[1]
    assert host.wait(timeout=10) == 0, host.communicate()[1]
    assert len(events(tmp_path)) == 2


@pytest.mark.timeout(60)
def test_exit_barrier_timeout_closes_the_job_under_a_laggard(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    host, peer = _host_then_peer(procs, tmp_path, "exit_barrier_timeout=1", peer_sleep=30)
    assert host.wait(timeout=40) == 0, host.communicate()[1]  # its own workers all succeeded
    t0 = time.monotonic()
    assert peer.wait(timeout=10) == 1
    assert time.monotonic() - t0 < 5  # told at once, not after its 30 s of work
    err = peer.communicate()[1]
    assert "did not finish within exit_barrier_timeout=1s" in err, err
    assert "exit_barrier_timeout" in host.communicate()[1]
    for e in events(tmp_path):
        assert not alive(int(str(e["pid"])))


@pytest.mark.parametrize("failed", [True, False], ids=["peer-gave-up", "job-finished"])
def test_closed_event_tells_a_failed_job_from_a_finished_one(
    tmp_path: Path, procs: list[subprocess.Popen[str]], failed: bool
) -> None:
    # The other node is this test process's own rendezvous handler: it lets the test close the
    # job either way while the agent's workers run, which no second real agent does on demand.
    from xrun.runtime.rendezvous import RendezvousParams, create_handler

    ep = f"127.0.0.1:{free_port()}"
    conf = dict(x.split("=") for x in FAST.split(","))
    host = create_handler(RendezvousParams("c10d", ep, "closing", 2, 2, 1, conf))
    try:
        a = popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                ep,
                "--rdzv-id",
                "closing",
                "--rdzv-conf",
                FAST,
                BEHAVE,
                str(tmp_path),
                "ready",
                "sleep:60",
            ),
        )
        info = host.next_rendezvous()
        if info.group_rank == 0:  # publish the workers' store address, as an agent would
            host.kv().set(f"xrun/master/{info.round}", b"127.0.0.1\n1")
        wait_for(lambda: list(tmp_path.glob("ready.*")), what="the agent's worker")
        t0 = time.monotonic()
        host.close(failed=failed, reason="stop now")
        rc = a.wait(timeout=20)
        assert time.monotonic() - t0 < 5
    finally:
        host.shutdown()
    err = a.communicate()[1]
    assert rc == (1 if failed else 0), err
    assert "stop now" in err
    assert ("closed by a peer" in err) == failed
    assert not alive(int(str(events(tmp_path)[0]["pid"])))


def test_worker_store_port_race_is_retried_not_fatal(tmp_path: Path) -> None:
    # rank 0's first attempt dies as if its store's port had been taken; no restarts allowed
    p = run(agent("--nproc-per-node", "2", BEHAVE, str(tmp_path), "port-race-once"))
    assert p.returncode == 0, p.stderr
    assert "retrying with a new port" in p.stderr
    ports = {e["MASTER_PORT"] for e in events(tmp_path)}
    assert len(events(tmp_path)) >= 3 and len(ports) == 2  # a fresh port for the retry


def test_module_no_python_and_run_path(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "work.py").write_text(
        "import os, sys\n"
        "open(os.path.join(sys.argv[1], 'm.' + os.environ['RANK']), 'w').write(repr(sys.flags.optimize))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = run(agent("--nproc-per-node", "2", "-m", "mypkg.work", str(tmp_path)), env=env)
    assert p.returncode == 0, p.stderr
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--no-python",
            "/bin/sh",
            "-c",
            f'echo "$LOCAL_RANK/$WORLD_SIZE" > {tmp_path}/sh.$RANK',
        )
    )
    assert p.returncode == 0, p.stderr
    p = run(agent("--nproc-per-node", "2", "--run-path", BEHAVE, str(tmp_path), "print:rp"))
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in tmp_path.glob("m.*")) == ["m.0", "m.1"]
    assert (tmp_path / "sh.1").read_text() == "1/2\n"
    assert p.stdout.count("rp\n") == 2 and len(events(tmp_path)) == 2


@pytest.mark.timeout(60)
def test_second_job_on_a_busy_endpoint_fails_fast_and_the_first_is_unharmed(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # Two 2x2 jobs, one endpoint (localhost:P), different run ids. The store lives in an agent of
    # the first job and ends with it, so the second job is refused at once (exit 2, one line
    # naming the fix) instead of running until the first job's end pulls its store away.
    port = free_port()

    def job(run_id: str, out: Path) -> list[subprocess.Popen[str]]:
        out.mkdir()
        return [
            popen(
                procs,
                agent(
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"localhost:{port}",
                    "--rdzv-id",
                    run_id,
                    "--rdzv-conf",
                    FAST,
                    BEHAVE,
                    str(out),
                    "sleep:1",
                ),
            )
            for _ in range(2)
        ]

    first = job("one", tmp_path / "one")
    wait_for(lambda: _serving(port), what="the first job's rendezvous store")
    t0 = time.monotonic()
    second = job("two", tmp_path / "two")
    for a in second:
        assert a.wait(timeout=20) == 2
        err = a.communicate()[1]
        assert err.count("\n") == 1 and "run id 'one'" in err and "own --rdzv-endpoint port" in err
    assert time.monotonic() - t0 < 5
    for a in first:
        assert a.wait(timeout=40) == 0, a.communicate()[1]
    assert len(events(tmp_path / "one")) == 4 and not events(tmp_path / "two")


# -- the rendezvous secret -----------------------------------------------------------------------


def test_standalone_store_is_token_protected_and_on_loopback(tmp_path: Path) -> None:
    # No secret configured: the standalone agent makes one up, so another local user who finds
    # its port (here: its own worker, which has no token) is refused.
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    p = run(agent("--nproc-per-node", "1", PROBE, str(tmp_path)), env=env)
    assert p.returncode == 0, p.stderr
    probe = json.loads((tmp_path / "probe.json").read_text())
    ((addr, port),) = probe["listen"]  # the store: 127.0.0.1 only, never 0.0.0.0 / ::
    assert addr == "127.0.0.1" and port > 0
    assert probe["refused"] == [True]


@pytest.mark.parametrize("entry", ["script", "binary"])
def test_the_secret_never_reaches_workers(tmp_path: Path, entry: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok-f1le-8f3a\n")
    token_file.chmod(0o600)
    env = {**os.environ, "XRUN_RDZV_TOKEN": "tok-env-91c2", "XRUN_RDZV_TOKEN_FILE": str(token_file)}
    if entry == "script":
        p = run(agent("--nproc-per-node", "2", PROBE, str(tmp_path)), env=env)
        assert p.returncode == 0, p.stderr
        probe = json.loads((tmp_path / "probe.json").read_text())
        assert probe["env"] == dict.fromkeys(SECRET_ENV)
        assert probe["refused"] == [True]  # the job's secret protects the store
    else:
        p = run(
            agent(
                "--nproc-per-node", "1", "--no-python", "/bin/sh", "-c", f"env > {tmp_path}/env.txt"
            ),
            env=env,
        )
        assert p.returncode == 0, p.stderr
        seen = (tmp_path / "env.txt").read_text()
        assert "XRUN_RDZV" not in seen and "tok-" not in seen
        assert "TORCHELASTIC_RUN_ID=" in seen  # the worker env is otherwise intact


# -- signals -------------------------------------------------------------------------------------


def test_sigterm_is_forwarded_to_workers(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    p = popen(
        procs,
        agent("--nproc-per-node", "2", BEHAVE, str(tmp_path), "trap-term", "ready", "sleep:60"),
    )
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="workers ready")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert sorted(x.name for x in tmp_path.glob("term.*")) == ["term.0", "term.1"]
    assert json.loads((tmp_path / "term.0").read_text()) == signal.SIGTERM


def test_handled_sigusr2_is_forwarded_then_shutdown(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    p = popen(
        procs,
        agent(
            "--nproc-per-node",
            "1",
            "--signals-to-handle",
            "SIGTERM,SIGUSR2",
            "--shutdown-timeout",
            "1",
            BEHAVE,
            str(tmp_path),
            "ready",
            "sleep:60",
        ),
    )
    wait_for(lambda: list(tmp_path.glob("ready.*")), what="worker ready")
    pid = int(str(events(tmp_path)[0]["pid"]))
    p.send_signal(signal.SIGUSR2)  # the worker does not handle SIGUSR2: it dies of it
    assert p.wait(timeout=20) == 128 + signal.SIGUSR2
    assert not alive(pid)


def test_sigterm_while_waiting_for_peers(procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    p = popen(
        procs,
        agent(
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "lonely",
            BEHAVE,
            "/nonexistent",
        ),
    )

    # once it serves the store it is in next_rendezvous, waiting for a node that never comes
    wait_for(lambda: _serving(port), what="the agent's rendezvous store")
    time.sleep(0.2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 3
    assert "Traceback" not in p.communicate()[1]


def test_sigkill_of_agent_leaves_no_workers(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    p = popen(procs, agent("--nproc-per-node", "2", BEHAVE, str(tmp_path), "ready", "sleep:60"))
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="workers ready")
    pids = [int(str(e["pid"])) for e in events(tmp_path)]
    p.kill()
    p.wait()
    deadline = time.monotonic() + 1.0
    while any(alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(alive(x) for x in pids)


# -- elasticity ----------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_elastic_join_mid_run(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    common = (
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "el",
        "--rdzv-conf",
        FAST,
    )
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:4:60")
    first = popen(procs, agent(*common, *actions))
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="first agent's workers")
    alone = events(tmp_path)
    assert {e["WORLD_SIZE"] for e in alone} == {"2"}
    second = popen(procs, agent(*common, *actions))
    assert second.wait(timeout=60) == 0, second.communicate()[1]
    assert first.wait(timeout=60) == 0, first.communicate()[1]
    evs = events(tmp_path)[len(alone) :]
    # (on a loaded machine the second agent may first form a world alone; it ends at 4)
    assert sorted(int(str(e["RANK"])) for e in evs if e["WORLD_SIZE"] == "4") == [0, 1, 2, 3]
    # a membership change is not a failure restart
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in evs} == {"0"}
    for e in alone:
        assert not alive(int(str(e["pid"])))


@pytest.mark.timeout(90)
def test_elastic_peer_killed_the_other_reforms(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    common = (
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "el2",
        "--rdzv-conf",
        FAST,
    )
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:1:60")
    host = popen(procs, agent(*common, *actions))
    # the first agent serves the store; the second is a client we may kill
    wait_for(lambda: _serving(port), what="the first agent's rendezvous store")
    other = popen(procs, agent(*common, *actions))
    wait_for(
        lambda: {e["WORLD_SIZE"] for e in events(tmp_path)} == {"2"} and len(events(tmp_path)) == 2,
        what="a two-node world",
    )
    other.kill()
    assert host.wait(timeout=30) == 0, host.communicate()[1]
    last = events(tmp_path)[-1]
    assert (last["WORLD_SIZE"], last["GROUP_WORLD_SIZE"], last["TORCHELASTIC_RESTART_COUNT"]) == (
        "1",
        "1",
        "0",
    )


# -- logs ----------------------------------------------------------------------------------------


def test_log_layout_tee_prefix_and_filter(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--rdzv-id",
            "ignored",
            "--log-dir",
            str(logs),
            "-t",
            "3",
            BEHAVE,
            str(tmp_path),
            "print:hello",
        )
    )
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[default0]:hello", "[default1]:hello"]
    assert "[default1]:err:hello" in p.stderr.splitlines()
    (run_dir,) = logs.iterdir()
    assert run_dir.name == events(tmp_path)[0]["TORCHELASTIC_RUN_ID"]
    for lr in (0, 1):
        d = run_dir / "attempt_0" / str(lr)
        assert (d / "stdout.log").read_text() == "hello\n"
        assert (d / "stderr.log").read_text() == "err:hello\n"

    out2 = tmp_path / "2"
    out2.mkdir()
    env = {**os.environ, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}>"}
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--role",
            "trainer",
            "--log-dir",
            str(logs),
            "-r",
            "2",
            "-t",
            "1",
            "--local-ranks-filter",
            "1",
            BEHAVE,
            str(out2),
            "print:x",
        ),
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["<trainer|1>x"]
    assert "err:x" not in p.stderr  # redirected to the file only
    run_dir2 = next(d for d in logs.iterdir() if d != run_dir)
    assert (run_dir2 / "attempt_0" / "0" / "stdout.log").read_text() == "x\n"  # files get all
    assert (run_dir2 / "attempt_0" / "0" / "stderr.log").read_text() == "err:x\n"


# -- cost ----------------------------------------------------------------------------------------


def test_agent_does_not_import_torch_and_stays_small(tmp_path: Path) -> None:
    code = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.stderr.write(p.stderr)\n"
    )
    p = run(
        [
            PY,
            "-c",
            code,
            PY,
            "-X",
            "importtime",
            "-m",
            "xrun.runtime",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            BEHAVE,
            str(tmp_path),
            "fail-rank:0",
        ]
    )
    rc, maxrss_kib = (int(x) for x in p.stdout.split())
    assert rc == 0, p.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in p.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "xrun.runtime.agent" in imported and "xrun.runtime.rendezvous" in imported
    heavy = {
        m
        for m in imported
        if m.split(".")[0] in ("torch", "numpy", "yaml", "fsspec", "docker", "docstring_parser")
    }
    assert not heavy
    # The store's host runs a selectors loop (runtime/_loop.py): asyncio alone would add
    # 15-60 ms and ~3 MiB to every standalone job's start-up.
    assert "asyncio" not in imported and "ssl" not in imported
    # ru_maxrss covers the agent and its (stdlib-only) workers
    assert maxrss_kib < 30 * 1024, f"peak RSS {maxrss_kib} KiB"


def test_overhead_over_spawning_workers_directly(tmp_path: Path) -> None:
    noop = tmp_path / "noop.py"
    noop.write_text("")
    flaky = tmp_path / "flaky.py"  # local rank 1 fails on attempt 0 only
    flaky.write_text(
        "import os, sys\nsys.exit(os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' "
        "and os.environ['LOCAL_RANK'] == '1')\n"
    )

    def direct() -> None:
        ps = [subprocess.Popen([PY, "-u", str(noop)]) for _ in range(4)]
        assert all(p.wait() == 0 for p in ps)

    def clean() -> None:
        assert subprocess.run(agent("--nproc-per-node", "4", str(noop))).returncode == 0

    def with_restart() -> None:
        cmd = agent("--nproc-per-node", "4", "--max-restarts", "1", str(flaky))
        assert subprocess.run(cmd, stderr=subprocess.DEVNULL).returncode == 0

    # interleaved best-of-3: the machine's load shifts all three the same way
    best = dict.fromkeys(("direct", "clean", "restart"), float("inf"))
    for _ in range(3):
        for key, fn in (("direct", direct), ("clean", clean), ("restart", with_restart)):
            t0 = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - t0)
    print(
        f"\n4 no-op workers: direct {best['direct']:.3f}s, via agent {best['clean']:.3f}s "
        f"(+{best['clean'] - best['direct']:.3f}s); with a failure+restart {best['restart']:.3f}s "
        f"(+{best['restart'] - best['clean']:.3f}s, the second start of 4 workers included)"
    )
    # Targets on an idle machine: +0.25 s, and +0.1 s over the second start of the workers.
    # Asserted relative to the measured spawn cost, so that a loaded CI machine (2-4x slower)
    # does not fail it while an agent that sleeps or polls does.
    assert best["clean"] < 2 * best["direct"] + 0.5
    assert best["restart"] < 2 * best["clean"] + 0.3
