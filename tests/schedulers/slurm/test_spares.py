"""``dist.ddp --spares 1`` on the real Slurm cluster: 2 nodes x 1 gloo worker + 1 spare node.

One active node (not the one whose agent serves the rendezvous store) is lost mid-training,
either its replica SIGKILLed (agent, workers and the task's shell: the whole process group) or
the node set DOWN (``scontrol update state=down``: slurmctld takes it out of the job and its
step daemon kills the task). The spare's agent takes the lost node's node rank and RANK, the
training goes on, and the job ends SUCCEEDED (schedulers/slurm/losses.py: ``--no-kill`` on
sbatch and srun, and the batch script judges the end from the replicas' codes).

The jobs ask for whole nodes (``exclusive``): setting a node DOWN kills every job on it, and
other tests share this cluster. ReturnToService=2 brings a DOWN node back as soon as its slurmd
answers (< 0.1 s here); the test resumes it anyway.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.chaos import listening_pid, runtime_agent
from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.spares import events
from tests.helpers.waiting import wait_for
from tests.schedulers.slurm.test_integration import sched, slurm_cluster  # noqa: F401
from xrun.components.dist import ddp
from xrun.schedulers.slurm import SlurmScheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=120"


def run_drill(sched: SlurmScheduler, tmp_path: Path, lose: str) -> None:  # noqa: F811
    shutil.copy(SCRIPTS / "spare_worker.py", tmp_path / "spare_worker.py")
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    app = ddp(
        str(out), script="spare_worker.py", j="2x1", spares=1, cpu=1, memMB=512,
        rdzv_port=port, rdzv_conf=CONF, max_retries=3,
    )  # fmt: skip
    # Replica 0 serves the store, as on a real cluster (the first node is the endpoint's host,
    # the only one where it is a local address); here every node is this host and the first
    # agent to bind would win.
    role = app.roles[0]
    conf = f"--rdzv-conf {CONF} "
    assert conf in role.args[1], role.args
    is_host = '$(test "$XRUN_REPLICA_ID" = 0 && echo true || echo false)'
    role.args[1] = role.args[1].replace(conf, f"--rdzv-conf {CONF},is_host={is_host} ")
    app_id = sched.submit(app, {"exclusive": True}, workspace=str(tmp_path))
    logs = tmp_path / "slurm-logs" / app_id / app.roles[0].name

    def stderr() -> str:
        return "".join(p.read_text() for p in sorted(logs.glob("*.stderr")))

    wait_for(lambda: len(events(out)) >= 2, timeout=240, what="the first world")
    wait_for(lambda: "standing by as a spare" in stderr(), timeout=120, what="a parked spare")
    first = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)}
    nodes = [(logs / f"{k}.node").read_text().strip() for k in range(3)]
    spare = next(n for n in nodes if n not in first)
    # Neither the first node (the batch script runs there: Slurm ends the job with it) nor the
    # agent that serves the store (docs/runtime.md) can be replaced: both are replica 0's.
    agent = runtime_agent(SLURM_JOB_ID=app_id, XRUN_NODE_ID=nodes[0])
    assert listening_pid(port, [agent]) == agent
    lost = next(n for n in nodes[1:] if n in first)
    t0 = time.monotonic()
    if lose == "kill":
        os.killpg(os.getpgid(runtime_agent(SLURM_JOB_ID=app_id, XRUN_NODE_ID=lost)), signal.SIGKILL)
    else:
        subprocess.run(
            ["scontrol", "update", f"nodename={lost}", "state=down", "reason=xrun-spares-test"],
            check=True, timeout=30,
        )  # fmt: skip
    try:
        wait_for(lambda: len(events(out)) >= 4, timeout=240, what="the world with the spare")
        took = time.monotonic() - t0
    finally:
        if lose == "down":
            # back to service (ReturnToService=2 has usually done it: then this is refused)
            subprocess.run(
                ["scontrol", "update", f"nodename={lost}", "state=resume"],
                capture_output=True, timeout=30,
            )  # fmt: skip
    second = {e["XRUN_NODE_ID"]: e["RANK"] for e in events(out)[2:4]}
    assert second[spare] == first[lost], (first, second)
    assert set(second.values()) == {"0", "1"}
    (out / "go").touch()
    resp = sched.wait(app_id, timeout=240)
    assert resp is not None
    assert resp.state == AppState.SUCCEEDED, (resp.msg, stderr()[-4000:])
    k = nodes.index(lost)
    replica = resp.roles_statuses[0].replicas[k]
    assert replica.state == AppState.FAILED and replica.hostname == lost, replica
    if lose == "down":
        assert f"node {lost} was lost" in replica.structured_error_msg, replica
    # xrun status, from another process: the spare, whom it replaced, the lost replica
    status = subprocess.run(
        [XRUN, "status", f"slurm://default/{app_id}"], capture_output=True, text=True, timeout=60
    ).stdout
    role = app.roles[0].name
    assert f"Spares ({role}): 1; 1 used, 0 idle" in status, status
    assert f"  {role}/{nodes.index(spare)} took group rank {first[lost]} in round 1" in status
    assert f"  lost: {role}/{k}" in status, status
    print(f"slurm --spares, {lose} {lost}: the spare {spare} took RANK {first[lost]}, "
          f"next world {took:.1f} s after the loss")  # fmt: skip


def test_spare_takes_the_rank_of_a_killed_replica(
    sched: SlurmScheduler,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_drill(sched, tmp_path, "kill")


def test_spare_takes_the_rank_of_a_node_set_down(
    sched: SlurmScheduler,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_drill(sched, tmp_path, "down")
