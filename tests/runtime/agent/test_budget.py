"""The job-wide restart budget and the quarantine (runtime/rendezvous/budget.py), with real
agents: several ``xrun-agent`` processes on one host, each its own node (``XRUN_NODE_ID``),
on the c10d store rendezvous and on etcd (the ``etcd`` fixture: tests/helpers/etcd.py)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import BEHAVE, FAST, agent, alive, events, popen, serving


def node(port: int, nnodes: str, max_restarts: int, out: Path, *actions: str) -> list[str]:
    return agent(
        "--nnodes", nnodes, "--nproc-per-node", "1", "--max-restarts", str(max_restarts),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "budget",
        "--rdzv-conf", FAST, BEHAVE, str(out), *actions,
    )  # fmt: skip


def env(node_id: str) -> dict[str, str]:
    return {**os.environ, "XRUN_NODE_ID": node_id}


def quarantined_alone(err: str) -> None:
    """Node ``bad``'s agent (``err``: its stderr) left the job quarantined for its workers'
    second lone failure, the job's budget counted once for it."""
    host = os.uname().nodename
    assert (
        f"xrun-agent: node bad (host {host}) quarantined: its workers failed alone 2 times" in err
    ), err
    assert "restart budget: 1 of 5 restarts used, 4 left (job-wide)" in err
    assert "; node bad (host" in err.splitlines()[-1]  # the root-cause line `xrun status` shows


def refused_then_replaced(
    node: Callable[..., list[str]],
    run_id: str,
    good: subprocess.Popen[str],
    procs: list[subprocess.Popen[str]],
    out: Path,
    sleep: str,
) -> subprocess.Popen[str]:
    """Node ``bad``'s next agent (``node(*actions)``: an agent of job ``run_id``) is refused in
    one line while the ``good`` node runs on; another node id from the same host is admitted
    (the quarantine is the node's): its agent, once the two form a world."""
    host = os.uname().nodename
    again = subprocess.run(
        node("ready"), env=env("bad"), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr
    (line,) = [x for x in again.stderr.splitlines() if "quarantined" in x]
    assert f"node bad (host {host}) is quarantined from job {run_id!r}" in line
    assert "its workers failed alone 2 times" in line and "not readmitted" in line
    assert alive(good.pid)
    other = popen(procs, node("ready", sleep), env=env("other"))
    wait_for(
        lambda: any(e["WORLD_SIZE"] == "2" for e in events(out)[-2:]),
        what="the good node's world with the new node",
        timeout=60,
    )
    return other


@pytest.mark.timeout(150)
def test_budget_is_job_wide(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    """Two nodes fail in turn: --max-restarts 2 is the job's, not each agent's. Each agent
    used to count its own failures, so the job ran 5 attempts (2 restarts per node) instead
    of 3. (The barrier: every attempt's two workers are counted before one fails; on the old
    code the nodes' restart counts differ and it never opens.)"""
    port = free_port()
    a = popen(
        procs,
        node(port, "2", 2, tmp_path, "barrier:2", "fail-on-turn:0:2", "sleep:60"),
        env=env("a"),
    )
    wait_for(lambda: serving(port), what="the first agent's store", timeout=60)
    b = popen(
        procs,
        node(port, "2", 2, tmp_path, "barrier:2", "fail-on-turn:1:2", "sleep:60"),
        env=env("b"),
    )
    err_a = a.communicate(timeout=120)[1]
    err_b = b.communicate(timeout=60)[1]
    assert (a.returncode, b.returncode) == (1, 1), err_a + err_b
    evs = events(tmp_path)
    assert len(evs) == 6, evs  # three attempts of two workers
    # every node's workers see the job's count
    assert sorted(str(e["TORCHELASTIC_RESTART_COUNT"]) for e in evs) == [
        "0",
        "0",
        "1",
        "1",
        "2",
        "2",
    ]
    assert "xrun-agent: restart budget spent: 2 of 2 restarts used (job-wide)" in err_a
    # the last line, the one `xrun status` shows for a failed replica, says it too
    assert err_a.splitlines()[-1].endswith(
        "; restart budget spent: 2 of 2 restarts used (job-wide)"
    )
    assert "restart budget: 1 of 2 restarts used, 1 left (job-wide)" in err_a
    assert "restart budget: 2 of 2 restarts used, 0 left (job-wide)" in err_b
    assert "quarantined" not in err_a + err_b  # each failed alone only once


# etcd's shortest lease is 2 s (a lost agent is seen in ~2-3 s)
ETCD_FAST = "heartbeat_interval=0.3,heartbeat_timeout=2,last_call_timeout=0.5,join_timeout=60"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_budget_is_job_wide_on_etcd(
    etcd: str, backend: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The same two nodes failing in turn on the etcd rendezvous: the budget is the job's there
    too, kept in its state document (it used to be each agent's, 5 attempts instead of 3)."""
    run_id = f"budget-{uuid.uuid4().hex[:10]}"  # etcd outlives a test

    def etcd_node(turn: int, node_id: str) -> subprocess.Popen[str]:
        cmd = agent(
            "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "2",
            "--rdzv-backend", backend, "--rdzv-endpoint", etcd, "--rdzv-id", run_id,
            "--rdzv-conf", ETCD_FAST, BEHAVE, str(tmp_path),
            "barrier:2", f"fail-on-turn:{turn}:2", "sleep:60",
        )  # fmt: skip
        return popen(procs, cmd, env=env(node_id))

    a, b = etcd_node(0, "a"), etcd_node(1, "b")
    err_a = a.communicate(timeout=120)[1]
    err_b = b.communicate(timeout=60)[1]
    assert (a.returncode, b.returncode) == (1, 1), err_a + err_b
    evs = events(tmp_path)
    assert len(evs) == 6, evs  # three attempts of two workers
    counts = sorted(str(e["TORCHELASTIC_RESTART_COUNT"]) for e in evs)
    assert counts == ["0", "0", "1", "1", "2", "2"], counts
    both = err_a + err_b
    assert "restart budget spent: 2 of 2 restarts used (job-wide)" in both, both
    assert "restart budget: 1 of 2 restarts used, 1 left (job-wide)" in both, both
    assert "restart budget: 2 of 2 restarts used, 0 left (job-wide)" in both, both


@pytest.mark.timeout(150)
def test_node_failing_alone_is_quarantined_and_refused(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A node whose workers fail where the other node's do not leaves the job after its second
    failure; the job goes on without it (elastic) and its next agent is refused at once."""
    port = free_port()
    good = popen(procs, node(port, "1:2", 5, tmp_path, "ready", "sleep:90"), env=env("good"))
    wait_for(lambda: serving(port), what="the first agent's store", timeout=60)
    bad = popen(procs, node(port, "1:2", 5, tmp_path, "fail-rank-always:0"), env=env("bad"))
    err = bad.communicate(timeout=90)[1]
    assert bad.returncode == 1, err
    quarantined_alone(err)
    # the good node re-forms alone and keeps running; the bad node's next agent is refused
    wait_for(
        lambda: any(e["WORLD_SIZE"] == "1" for e in events(tmp_path)),
        what="the good node's world of one",
        timeout=60,
    )
    job = partial(node, port, "1:2", 5, tmp_path)
    other = refused_then_replaced(job, "budget", good, procs, tmp_path, "sleep:90")
    assert other.poll() is None


@pytest.mark.timeout(150)
def test_failure_on_every_node_quarantines_nobody(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A bug in the script: every node's workers fail the same way. The job-wide budget ends
    the job after 3 restarts (counted once per round, not per node); nobody is quarantined."""
    port = free_port()
    acts = ("barrier:2", "fail-rank-always:0")
    a = popen(procs, node(port, "2", 3, tmp_path, *acts), env=env("a"))
    wait_for(lambda: serving(port), what="the first agent's store", timeout=60)
    b = popen(procs, node(port, "2", 3, tmp_path, *acts), env=env("b"))
    err = a.communicate(timeout=120)[1] + b.communicate(timeout=60)[1]
    assert (a.returncode, b.returncode) == (1, 1), err
    assert len(events(tmp_path)) == 8, err  # four attempts of two workers
    assert "restart budget spent: 3 of 3 restarts used (job-wide)" in err
    assert "quarantined" not in err


@pytest.mark.timeout(150)
def test_lost_agent_is_quarantined(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    """An agent SIGKILLed mid-run: its node id is quarantined by the store the moment its
    connection closes, so an agent restarted on it at once is refused."""
    port = free_port()
    good = popen(procs, node(port, "1:2", 3, tmp_path, "ready", "sleep:90"), env=env("good"))
    wait_for(lambda: serving(port), what="the first agent's store", timeout=60)
    lost = popen(procs, node(port, "1:2", 3, tmp_path, "ready", "sleep:90"), env=env("lost"))
    wait_for(lambda: any(e["WORLD_SIZE"] == "2" for e in events(tmp_path)), what="a pair")
    lost.kill()
    again = subprocess.run(
        node(port, "1:2", 3, tmp_path, "ready"), env=env("lost"), capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr
    assert "node lost (host" in again.stderr and "its agent was lost in round" in again.stderr
    assert alive(good.pid)


def etcd_node(
    etcd: str, run_id: str, out: Path, nnodes: str, restarts: int, *acts: str
) -> list[str]:
    return agent(
        "--nnodes", nnodes, "--nproc-per-node", "1", "--max-restarts", str(restarts),
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd, "--rdzv-id", run_id,
        "--rdzv-conf", ETCD_FAST, BEHAVE, str(out), *acts,
    )  # fmt: skip


@pytest.mark.timeout(180)
def test_node_failing_alone_is_quarantined_and_refused_on_etcd(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The lone-failure quarantine on etcd, kept in the job's state document: the same lines as
    on c10d, and the quarantined node's next agent is refused the same way. (It used to be
    c10d's only: on etcd the bad node failed on, spending the job's budget.)"""
    run_id = f"lone-{uuid.uuid4().hex[:10]}"  # etcd outlives a test

    def node(*acts: str) -> list[str]:
        return etcd_node(etcd, run_id, tmp_path, "1:2", 5, *acts)

    good = popen(procs, node("ready", "sleep:120"), env=env("good"))
    wait_for(lambda: events(tmp_path), what="the good node's first world", timeout=60)
    bad = popen(procs, node("fail-rank-always:0"), env=env("bad"))
    err = bad.communicate(timeout=120)[1]
    assert bad.returncode == 1, err
    quarantined_alone(err)
    # the good node re-forms alone (the last workers started, the bad node gone) and keeps
    # running; the bad node's next agent is refused
    wait_for(
        lambda: events(tmp_path)[-1]["WORLD_SIZE"] == "1",
        what="the good node's world of one",
        timeout=60,
    )
    other = refused_then_replaced(node, run_id, good, procs, tmp_path, "sleep:120")
    assert other.poll() is None and alive(good.pid)


@pytest.mark.timeout(180)
def test_failure_on_every_node_quarantines_nobody_on_etcd(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A bug in the script on an elastic etcd job (1:2, so that a node could be quarantined):
    every node's workers fail the same way, the budget ends the job, nobody is quarantined."""
    run_id = f"lone-{uuid.uuid4().hex[:10]}"
    cmd = etcd_node(etcd, run_id, tmp_path, "1:2", 3, "barrier:2", "fail-rank-always:0")
    a = popen(procs, cmd, env=env("a"))
    b = popen(procs, cmd, env=env("b"))
    err = a.communicate(timeout=150)[1] + b.communicate(timeout=60)[1]
    assert (a.returncode, b.returncode) == (1, 1), err
    assert len(events(tmp_path)) == 8, err  # four attempts of two workers
    assert "restart budget spent: 3 of 3 restarts used (job-wide)" in err
    assert "quarantined" not in err
