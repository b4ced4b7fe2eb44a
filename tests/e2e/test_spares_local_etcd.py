"""``dist.ddp --spares 1 --rdzv_backend etcd`` on local_cwd, the real CLI, agents, gloo workers
and the suite's etcd: the replica that holds RANK 0 - with c10d often the store's host, which
cannot be replaced - is SIGKILLed with its process group; the spare replica takes group rank 0
and RANK 0, the app ends SUCCEEDED, and ``xrun status`` tells who replaced whom."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers.chaos import runtime_agent
from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.spares import events
from tests.helpers.waiting import wait_for

CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=60"


@pytest.mark.timeout(300)
def test_a_spare_replica_takes_rank_0_of_a_lost_replica(etcd: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    err = tmp_path / "run.err"
    with open(err, "w") as f:
        run = subprocess.Popen(
            [
                XRUN, "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}",
                "dist.ddp", "-j", "2x1", "--spares", "1", "--rdzv_backend", "etcd",
                "--rdzv_endpoint", etcd, "--rdzv_conf", f"{CONF},etcd_prefix=/t/{uuid.uuid4().hex}",
                "--max_retries", "3", "--script", str(SCRIPTS / "spare_worker.py"), "--", str(out),
            ],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=f, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: len(events(out)) >= 2, timeout=150, what="the first world")
        wait_for(lambda: "standing by as a spare" in err.read_text(), timeout=60, what="a spare")
        first = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)}
        role = next(iter(first)).split("/")[0]
        spare = next(f"{role}/{i}" for i in range(3) if f"{role}/{i}" not in first)
        lost = next(n for n, rank in first.items() if rank == "0")
        os.killpg(runtime_agent(XRUN_NODE_ID=lost), signal.SIGKILL)
        try:
            wait_for(lambda: len(events(out)) >= 4, timeout=150, what="the second world")
        except AssertionError as e:
            raise AssertionError(
                f"{e}; lost {lost}, spare {spare}:\n{err.read_text()[-4000:]}"
            ) from None
        second = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)[2:4]}
        assert second[spare] == "0" and set(second.values()) == {"0", "1"}, (first, second)
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
    assert f"  {spare} took group rank 0 in round 1" in status, status
    assert "1 used, 0 idle" in status and f"  lost: {lost}" in status, status
