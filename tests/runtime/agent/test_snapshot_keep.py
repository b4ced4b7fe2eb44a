"""A job's /dev/shm snapshots survive the agent's wait between attempts: the agent holds them
while no worker does, so another job's collector (snapshot.py) does not take them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import FAST, agent, alive, popen, serving
from xrun.runtime import snapshot
from xrun.runtime.store.client import StoreClient

# Enters the job's snapshot dir (as a training script's Snapshotter does), says where, waits.
WORKER = """
import json, os, sys, time
from xrun.runtime.snapshot import Snapshotter
snap = Snapshotter(every=1)
out = os.path.join(sys.argv[1], "ready." + os.environ["XRUN_NODE_ID"])
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "dir": str(snap.job_dir)}, f)
os.replace(out + ".tmp", out)
time.sleep(600)
"""


@pytest.mark.skipif(not os.path.isdir(snapshot.DEFAULT_ROOT), reason="no /dev/shm")
@pytest.mark.timeout(180)
def test_snapshots_are_not_collected_while_the_agent_waits_for_a_node(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    run_id = f"keep{os.getpid()}x{port}"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = agent(
        "--nnodes", "2:2", "--nproc-per-node", "1", "--max-restarts", "3",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", FAST.replace("join_timeout=30", "join_timeout=120"),
        str(script), str(tmp_path),
    )  # fmt: skip

    def start(node: str) -> subprocess.Popen[str]:
        return popen(procs, cmd, env={**os.environ, "XRUN_NODE_ID": node}, start_new_session=True)

    a = start("a")
    wait_for(lambda: serving(port), what="the host's store")
    b = start("b")
    ready = {n: tmp_path / f"ready.{n}" for n in "ab"}
    wait_for(lambda: all(p.exists() for p in ready.values()), timeout=90, what="both workers")
    info = {n: json.loads(p.read_text()) for n, p in ready.items()}
    job_dir = Path(info["a"]["dir"])
    try:
        assert job_dir.is_dir()
        # Node b is lost (its agent and worker killed): a stops its worker and waits for a node.
        os.killpg(b.pid, signal.SIGKILL)
        c = StoreClient("127.0.0.1", port, read_timeout=150.0)
        try:
            assert c.wait([f"{run_id}/rdzv/1/node/1"], timeout=90) is not None
        finally:
            c.close()
        wait_for(lambda: not alive(info["a"]["pid"]), timeout=60, what="a's worker stopped")
        assert a.poll() is None
        # The wait has lasted past GC_IDLE_S (the lock's mtime says so): what another job's
        # Snapshotter starting on this node then does to a directory nobody holds.
        old = time.time() - 2 * snapshot.GC_IDLE_S
        os.utime(job_dir / "lock", (old, old))
        snapshot._remove_unheld(job_dir)
        assert job_dir.is_dir(), "the waiting job's snapshots were collected"
    finally:
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for n in "ab":
            shutil.rmtree(Path(info[n]["dir"]), ignore_errors=True)
