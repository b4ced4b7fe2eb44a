# ruff: noqa: F811  (the sched fixture is imported, then named by the tests)
"""The slurm scheduler on the real cluster, where the side-by-side comparison with TorchX found
xrun wrong: a static rendezvous over several nodes, ``--max_retries`` applied twice, a comment
with spaces, agents' logs left in the nodes' temp dir."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.schedulers.slurm.test_integration import (
    ALLREDUCE,
    _release_begin_time,
    read,
    sched,  # noqa: F401  (the fixture)
    slurm_cluster,  # noqa: F401  (the session fixture)
    wait,
)
from xrun.components import utils
from xrun.components.dist import ddp
from xrun.schedulers.api import DescribeAppResponse
from xrun.schedulers.slurm import SlurmScheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

ALWAYS_FAILS = """\
import os, sys
with open("attempts", "a") as f:
    f.write(f"attempt restart={os.environ['TORCHELASTIC_RESTART_COUNT']} "
            f"requeue={os.environ.get('SLURM_RESTART_COUNT', '0')}\\n")
sys.exit(3)
"""


def test_static_rendezvous_2x2_allreduce_on_two_nodes(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    app = ddp(
        script="allreduce.py",
        j="2x2",
        cpu=1,
        memMB=512,
        rdzv_backend="static",
        rdzv_port=free_port(),
    )
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = wait(sched, app_id)
    logs = tmp_path / "slurm-logs" / app_id / "allreduce"
    assert resp.state == AppState.SUCCEEDED, (resp.msg, read(logs / "0.stderr"))
    out = read(logs / "0.stdout") + read(logs / "1.stdout")
    for rank in range(4):
        assert f"rank {rank}/4 sum=10 " in out, out
    # two nodes of the cluster, whichever two were free (c1 and c2 on a quiet cluster; other
    # tests' jobs, exclusive ones included, may hold them)
    nodes = {ln.rsplit("node=", 1)[1] for ln in out.splitlines() if "node=" in ln}
    assert len(nodes) == 2 and nodes <= {"c1", "c2", "c3", "c4"}, nodes
    # The agents' per-attempt logs went under the job's own logs, not into a node's /tmp.
    workers = logs / "0.workers" / app_id / "attempt_0"
    assert sorted(p.name for p in workers.iterdir()) == ["0", "1"]


def _wait_releasing_holds(sched: SlurmScheduler, app_id: str) -> DescribeAppResponse:
    """Wait for the end, cutting short Slurm's ~120 s hold of any requeued attempt."""
    deadline = time.monotonic() + 240
    held_since: float | None = None
    while True:
        resp = sched.describe(app_id)
        assert resp is not None
        if "reason=BeginTime" in resp.msg:
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > 3:
                _release_begin_time(app_id)
                held_since = None
        if resp.state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED):
            return resp
        assert time.monotonic() < deadline, f"job {app_id} stuck: {resp}"
        time.sleep(0.3)


def test_a_job_that_always_fails_runs_max_retries_plus_one_times(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    (tmp_path / "fail.py").write_text(ALWAYS_FAILS)
    app = ddp(script="fail.py", j="1x1", cpu=1, memMB=256, max_retries=2)
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = _wait_releasing_holds(sched, app_id)
    assert resp.state == AppState.FAILED, resp.msg
    lines = (tmp_path / "attempts").read_text().splitlines()
    # 2 in-place restarts by the agent; the batch script requeued nothing on top
    assert lines == [f"attempt restart={i} requeue=0" for i in range(3)]
    assert resp.num_restarts == 0


def test_a_plain_role_is_requeued_by_slurm_max_retries_times(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    app = utils.sh("echo requeue=${SLURM_RESTART_COUNT:-0} >> attempts; exit 3", max_retries=1)
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = _wait_releasing_holds(sched, app_id)
    assert resp.state == AppState.FAILED and resp.num_restarts == 1, resp.msg
    assert (tmp_path / "attempts").read_text().splitlines() == ["requeue=0", "requeue=1"]


def test_a_comment_with_spaces_is_submitted_and_read_back(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    app_id = sched.submit(
        utils.echo(msg="hi"), {"comment": "run 7, take two"}, workspace=str(tmp_path)
    )
    resp = wait(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    shown = subprocess.run(
        ["scontrol", "show", "job", app_id], capture_output=True, text=True, check=True
    ).stdout
    assert "Comment=xrun:echo;echo=1,run 7, take two" in shown, shown
    assert any(a.app_id == app_id and a.name == "echo" for a in sched.list())
