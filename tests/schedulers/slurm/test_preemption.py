"""A real preemption on the suite's Slurm cluster (scripts/slurm-cluster.sh: partitions ``low``,
preemptible with REQUEUE and GraceTime=60, and ``high`` above it).

At a preemption inside a GraceTime the job's tasks get SIGTERM at once and the batch shell
nothing; a job that ends itself inside the grace counts as done. Before xrun's graceful stop a
2x1 DDP job on ``low`` was FAILED with exit 143 0.5 s after the preemption and never requeued.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.net import free_port
from tests.helpers.slurm import SlurmCluster
from xrun.components.dist import ddp
from xrun.schedulers.api import DescribeAppResponse, Stream
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

slurm_cluster = slurm_fixture.slurm_cluster

# Each rank checkpoints its own step (the agreed one) and resumes from it.
TRAIN = """\
import os, sys, time
import torch
import torch.distributed as dist
from xrun.runtime import stop

dist.init_process_group("gloo")
rank = dist.get_rank()
mine = f"ckpt/rank{rank}.step"
start = int(open(mine).read()) if os.path.exists(mine) else 0
if start:
    print(f"rank {rank}: resuming from step {start}", flush=True)
t = torch.ones(1)
for step in range(start + 1, 61):
    dist.all_reduce(t)
    time.sleep(0.1)
    print(f"rank {rank}: step {step}", flush=True)
    if stop.requested(step):
        os.makedirs("ckpt", exist_ok=True)
        with open(mine + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(mine + ".tmp", mine)
        print(f"rank {rank}: stopping at step {step}: checkpoint saved", flush=True)
        os._exit(0)
print(f"rank {rank}: done", flush=True)
dist.barrier()
os._exit(0)
"""


@pytest.fixture
def sched(slurm_cluster: SlurmCluster) -> Iterator[SlurmScheduler]:
    s = create_scheduler("test")
    yield s
    subprocess.run(["scancel", "--name=preempt-me,preemptor"], check=False)


def test_the_cluster_has_preemptible_partitions(slurm_cluster: SlurmCluster) -> None:
    parts = subprocess.run(
        ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {"debug*", "low", "high"} <= set(parts), parts
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"^PreemptType\s*=\s*preempt/partition_prio$", config, re.M), config


def _log(sched: SlurmScheduler, app_id: str, role: str, k: int) -> str:
    return "".join(sched.log_iter(app_id, role, k, streams=Stream.STDOUT))


def _wait_end(sched: SlurmScheduler, app_id: str, timeout: float = 200) -> DescribeAppResponse:
    """The end of a job that may be requeued; Slurm's ~120 s BeginTime hold of a requeued job
    is cut short after 3 s (slurmd refuses a job id it killed a moment ago)."""
    deadline = time.monotonic() + timeout
    held_since: float | None = None
    while True:
        resp = sched.describe(app_id)
        assert resp is not None
        if "reason=BeginTime" in resp.msg:
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > 3:
                subprocess.run(["scontrol", "update", f"JobId={app_id}", "StartTime=now"])
        if resp.state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED):
            return resp
        assert time.monotonic() < deadline, f"job {app_id} stuck: {resp}"
        time.sleep(0.3)


def test_a_real_preemption_stops_at_one_step_requeues_once_and_resumes(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    app = ddp(script="train.py", j="2x1", cpu=1, memMB=256, max_retries=1, rdzv_port=free_port())
    app.name = "preempt-me"
    cfg = {"partition": "low", "exclusive": True, "job_name": "preempt-me"}
    app_id = sched.submit(app, cfg, workspace=str(tmp_path))
    role = app.roles[0].name
    deadline = time.monotonic() + 120
    while not all("step 5\n" in _log(sched, app_id, role, k) for k in (0, 1)):
        assert time.monotonic() < deadline, "the job did not train"
        time.sleep(0.3)
    nodes = subprocess.run(
        ["squeue", "-h", "-j", app_id, "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # A job on `high` that needs the xrun job's nodes: Slurm preempts the xrun job for it.
    subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-N2", f"--nodelist={nodes}", "-J", "preemptor",
         "-o", "/dev/null", "--wrap", "sleep 1"],
        check=True, capture_output=True,
    )  # fmt: skip
    resp = _wait_end(sched, app_id)
    logs = [_log(sched, app_id, role, k) for k in (0, 1)]
    assert resp.state == AppState.SUCCEEDED, f"{resp.msg}\n{logs}"
    assert resp.num_restarts == 1, resp.msg  # requeued exactly once
    assert "preempted 1 time(s)" in resp.msg, resp.msg
    stops = {int(m) for log in logs for m in re.findall(r"stopping at step (\d+)", log)}
    resumes = {int(m) for log in logs for m in re.findall(r"resuming from step (\d+)", log)}
    assert len(stops) == 1 and stops == resumes, logs  # one agreed step, resumed from it
    assert all(log.count("checkpoint saved") == 1 and "done" in log for log in logs), logs


def test_a_preempted_example_resumes_from_its_step_and_ends_bit_identical(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    # examples/train_ddp.py, 2x2 on `low`, preempted mid-epoch: rank 0 saves the agreed step
    # and says so, the requeued attempt says where it resumes, the final parameters are those
    # of an undisturbed run of the same world size.
    import json
    import shutil

    from tests.helpers.paths import TRAIN
    from tests.helpers.stop_drill import EXAMPLE_ARGS, example_reference, example_stop_and_resume

    reference = example_reference(tmp_path)
    shutil.copy(TRAIN, tmp_path / TRAIN.name)
    args = [*EXAMPLE_ARGS, "--step-sleep", "0.2", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--out", str(tmp_path / "result.json")]  # fmt: skip
    app = ddp(
        *args, script=TRAIN.name, j="2x2", cpu=2, memMB=1024, max_retries=1,
        rdzv_port=free_port(),
    )  # fmt: skip
    app.name = "preempt-me"
    cfg = {"partition": "low", "exclusive": True, "job_name": "preempt-me"}
    app_id = sched.submit(app, cfg, workspace=str(tmp_path))
    role = app.roles[0].name
    deadline = time.monotonic() + 180
    while not any(
        re.search(r"^(?:\[\w+\]:)?step 5$", _log(sched, app_id, role, k), re.M) for k in (0, 1)
    ):
        assert time.monotonic() < deadline, "the job did not train"
        time.sleep(0.3)
    nodes = subprocess.run(
        ["squeue", "-h", "-j", app_id, "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-N2", f"--nodelist={nodes}", "-J", "preemptor",
         "-o", "/dev/null", "--wrap", "sleep 1"],
        check=True, capture_output=True,
    )  # fmt: skip
    resp = _wait_end(sched, app_id, timeout=400)
    log = "".join(_log(sched, app_id, role, k) for k in (0, 1))
    assert resp.state == AppState.SUCCEEDED, f"{resp.msg}\n{log}"
    assert resp.num_restarts == 1 and "preempted 1 time(s)" in resp.msg, resp.msg
    step = example_stop_and_resume(log)
    assert 5 <= step < 60, step  # mid-run: the resume had steps left to train
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["params_sha256"] == reference, (result, reference)
