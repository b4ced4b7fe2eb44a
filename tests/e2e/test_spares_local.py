"""``dist.ddp --spares`` on local_cwd, the real CLI, agents and gloo workers: each replica is
its own node (``XRUN_NODE_ID=<role>/<i>``); one active replica's agent is SIGKILLed with its
process group, and the spare replica takes its node rank and RANK. On c10d the lost replica is
one that does not serve the store; on etcd (the suite's) it is the one that holds RANK 0 -
with c10d often the store's host, which cannot be replaced. The app ends SUCCEEDED, and
``xrun status`` tells who replaced whom."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.chaos import listening_pid, runtime_agent
from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.spares import events
from tests.helpers.waiting import wait_for

CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout=60"
# etcd's shortest lease is 2 s
ETCD_CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=60"

# (the first world: node id -> RANK, the spare's node id) -> the node to lose
Pick = Callable[[dict[str, str], str], str]


class Drill:
    """What one drill saw: the worlds before and after the loss, who was lost and who took
    its place, and ``xrun status`` of the finished app."""

    def __init__(self, first: dict[str, str], second: dict[str, str], lost: str, spare: str):
        self.first, self.second, self.lost, self.spare = first, second, lost, spare
        self.status = ""


def drill(tmp_path: Path, rdzv: list[str], pick: Pick) -> Drill:
    out = tmp_path / "out"
    out.mkdir()
    err = tmp_path / "run.err"
    with open(err, "w") as f:
        run = subprocess.Popen(
            [
                XRUN, "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}",
                "dist.ddp", "-j", "2x1", "--spares", "1", *rdzv, "--max_retries", "3",
                "--script", str(SCRIPTS / "spare_worker.py"), "--", str(out),
            ],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=f, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: len(events(out)) >= 2, timeout=150, what="the first world")
        wait_for(lambda: "standing by as a spare" in err.read_text(), timeout=60, what="a spare")
        first = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)}
        role = next(iter(first)).split("/")[0]
        spare = next(f"{role}/{i}" for i in range(3) if f"{role}/{i}" not in first)
        lost = pick(first, spare)
        os.killpg(runtime_agent(XRUN_NODE_ID=lost), signal.SIGKILL)
        try:
            wait_for(lambda: len(events(out)) >= 4, timeout=150, what="the second world")
        except AssertionError as e:
            raise AssertionError(
                f"{e}; lost {lost}, spare {spare}:\n{err.read_text()[-4000:]}"
            ) from None
        second = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)[2:4]}
        (out / "go").touch()
        stdout, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err.read_text()[-3000:]
    seen = Drill(first, second, lost, spare)
    seen.status = subprocess.run(
        [XRUN, "status", stdout.strip().splitlines()[0]],
        cwd="/", capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert "State: SUCCEEDED" in seen.status, seen.status
    assert f"{lost}: FAILED" in seen.status and "killed by signal 9" in seen.status, seen.status
    # the lost replica and the spare, used (xrun/cli/spares_view.py)
    assert "1 used, 0 idle" in seen.status and f"  lost: {lost}" in seen.status, seen.status
    return seen


@pytest.mark.timeout(240)
def test_spare_replica_takes_the_lost_replicas_rank(tmp_path: Path) -> None:
    port = free_port()

    def not_the_store_host(first: dict[str, str], spare: str) -> str:
        # Lose an active replica that does not serve the store (which cannot be replaced,
        # see docs/runtime.md). On one host the store is the first agent's to bind the port:
        # usually replica 0, but not always (the spare may be replica 0 and a replica 2 the
        # host), and the host may even be the spare: on a busy host its own join came in
        # third (a stress run).
        agents = {n: runtime_agent(XRUN_NODE_ID=n) for n in [*first, spare]}
        host = listening_pid(port, list(agents.values()))
        assert host is not None, "no agent serves the store"
        return next(n for n in sorted(first) if agents[n] != host)

    seen = drill(tmp_path, ["--rdzv_port", str(port), "--rdzv_conf", CONF], not_the_store_host)
    assert seen.second[seen.spare] == seen.first[seen.lost], (seen.first, seen.second)
    assert set(seen.second.values()) == {"0", "1"}
    # the spare, the group rank it took
    assert f"  {seen.spare} took group rank {seen.first[seen.lost]} in round 1" in seen.status


@pytest.mark.timeout(300)
def test_a_spare_replica_takes_rank_0_of_a_lost_replica_on_etcd(etcd: str, tmp_path: Path) -> None:
    conf = f"{ETCD_CONF},etcd_prefix=/t/{uuid.uuid4().hex}"
    rdzv = ["--rdzv_backend", "etcd", "--rdzv_endpoint", etcd, "--rdzv_conf", conf]
    seen = drill(tmp_path, rdzv, lambda first, _: next(n for n, r in first.items() if r == "0"))
    assert seen.second[seen.spare] == "0", (seen.first, seen.second)
    assert set(seen.second.values()) == {"0", "1"}
    assert f"  {seen.spare} took group rank 0 in round 1" in seen.status, seen.status
