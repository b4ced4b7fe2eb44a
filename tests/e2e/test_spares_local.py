"""``dist.ddp --spares`` on local_cwd, the real CLI, agents and gloo workers: each replica is
its own node (``XRUN_NODE_ID=<role>/<i>``); one active replica's agent is SIGKILLed with its
process group, and the spare replica takes its node rank and RANK."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.chaos import listening_pid, runtime_agent
from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.spares import events
from tests.helpers.waiting import wait_for

CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout=60"


@pytest.mark.timeout(240)
def test_spare_replica_takes_the_lost_replicas_rank(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    err = tmp_path / "run.err"
    with open(err, "w") as f:
        port = free_port()
        run = subprocess.Popen(
            [
                XRUN, "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}",
                "dist.ddp", "-j", "2x1", "--spares", "1", "--rdzv_port", str(port),
                "--rdzv_conf", CONF, "--max_retries", "3", "--script",
                str(SCRIPTS / "spare_worker.py"), "--", str(out),
            ],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=f, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: len(events(out)) >= 2, timeout=150, what="the first world")
        wait_for(lambda: "standing by as a spare" in err.read_text(), timeout=60, what="a spare")
        first = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)}
        role = next(iter(first)).split("/")[0]
        spare = next(f"{role}/{i}" for i in range(3) if f"{role}/{i}" not in first)
        # Lose an active replica that does not serve the store (which cannot be replaced, see
        # docs/runtime.md). On one host the store is the first agent's to bind the port: usually
        # replica 0, but not always (the spare may be replica 0 and a replica 2 the host), and
        # the host may even be the spare: on a busy host its own join came in third (a stress run).
        agents = {n: runtime_agent(XRUN_NODE_ID=n) for n in [*first, spare]}
        host = listening_pid(port, list(agents.values()))
        assert host is not None, "no agent serves the store"
        lost = next(n for n in sorted(first) if agents[n] != host)
        os.killpg(agents[lost], signal.SIGKILL)
        try:
            wait_for(lambda: len(events(out)) >= 4, timeout=150, what="the second world")
        except AssertionError as e:
            raise AssertionError(
                f"{e}; lost {lost}, spare {spare}:\n{err.read_text()[-4000:]}"
            ) from None
        second = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)[2:4]}
        assert second[spare] == first[lost], (first, second)
        assert set(second.values()) == {"0", "1"}
        (out / "go").touch()
        stdout, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err.read_text()[-3000:]
    status = subprocess.run(
        [XRUN, "status", stdout.strip().splitlines()[0]],
        cwd="/", capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert "State: SUCCEEDED" in status, status
    assert f"{lost}: FAILED" in status and "killed by signal 9" in status, status
    # the spare, the group rank it took, the lost replica (xrun/cli/spares_view.py)
    assert f"  {spare} took group rank {first[lost]} in round 1" in status, status
    assert "1 used, 0 idle" in status and f"  lost: {lost}" in status, status
