"""Failures end to end: restarts, the failure summary and error files, peers that fail or lag
(the exit barrier), the closed verdict, a busy endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import BEHAVE, FAST, agent, alive, events, popen, run, serving

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
    wait_for(lambda: serving(port), what="the first agent's rendezvous store")
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
    from xrun.runtime.rendezvous import Endpoint, RendezvousParams, create_handler

    ep = f"127.0.0.1:{free_port()}"
    conf = dict(x.split("=") for x in FAST.split(","))
    host = create_handler(RendezvousParams("c10d", Endpoint.parse(ep), "closing", 2, 2, 1, conf))
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
        host.next_rendezvous()
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
    # The first job's workers sleep long enough that it is still running when the second job's
    # agents have started on a loaded machine (with 1 s, at load 15 it had ended before they
    # connected, and the second job rightly ran on a free port).
    port = free_port()

    def job(run_id: str, out: Path, work: str) -> list[subprocess.Popen[str]]:
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
                    work,
                ),
            )
            for _ in range(2)
        ]

    first = job("one", tmp_path / "one", "sleep:20")
    wait_for(lambda: serving(port), what="the first job's rendezvous store")
    second = job("two", tmp_path / "two", "sleep:1")
    for a in second:
        assert a.wait(timeout=20) == 2
        err = a.communicate()[1]
        assert err.count("\n") == 1 and "run id 'one'" in err and "own --rdzv-endpoint port" in err
    # Fast: refused while the first job still runs, not when its end pulls the store away.
    assert all(a.poll() is None for a in first)
    for a in first:
        assert a.wait(timeout=40) == 0, a.communicate()[1]
    assert len(events(tmp_path / "one")) == 4 and not events(tmp_path / "two")
