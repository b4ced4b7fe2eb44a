"""``dist.ddp --recover warm`` on the suite's real Slurm cluster (issue #34): examples/train_ddp.py
as a 2x2 job (two nodes, one agent each). Once both nodes' pools are full, a worker of the
second replica (``XRUN_REPLICA_ID=1``, exported by the batch script) is SIGKILLed; its agent
replaces the workers from the pool, the ranks restore their state from shared memory, 0 steps
lost, bit-identical, and the job SUCCEEDS with no requeue (tests/helpers/warm_drill.py says
what is asserted). The cluster's nodes are this host, so the kill is a plain ``kill -9``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers import warm_drill
from tests.helpers.net import free_port
from tests.helpers.paths import PY, TRAIN
from tests.helpers.slurm import SlurmCluster
from xrun.components.dist import ddp
from xrun.schedulers.api import DescribeAppResponse
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

slurm_cluster = slurm_fixture.slurm_cluster
ROLE = TRAIN.stem


@pytest.fixture
def sched(slurm_cluster: SlurmCluster) -> Iterator[SlurmScheduler]:
    s = create_scheduler("test")
    yield s
    subprocess.run(["scancel", "--name=warm-recover"], check=False)


def _logs(sched: SlurmScheduler, app_id: str) -> str:
    return "".join("".join(sched.log_iter(app_id, ROLE, k)) for k in (0, 1))


def _wait_end(sched: SlurmScheduler, app_id: str, timeout: float) -> DescribeAppResponse:
    deadline = time.monotonic() + timeout
    while True:
        resp = sched.describe(app_id)
        assert resp is not None
        if resp.state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED):
            return resp
        assert time.monotonic() < deadline, f"job {app_id} stuck: {resp}"
        time.sleep(0.5)


def test_a_killed_rank_on_the_second_node_recovers_warm(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    ref = warm_drill.reference(tmp_path)
    shutil.copy(TRAIN, tmp_path / TRAIN.name)
    marker = str(tmp_path / "ckpt")
    app = ddp(
        *warm_drill.ARGS, *warm_drill.SLEEP, "--checkpoint-dir", marker,
        "--out", str(tmp_path / "result.json"),
        script=TRAIN.name, j="2x2", cpu=2, memMB=1024, max_retries=2, recover="warm",
        rdzv_port=free_port(),
    )  # fmt: skip
    app.name = "warm-recover"
    app_id = sched.submit(app, {"job_name": "warm-recover"}, workspace=str(tmp_path))
    try:
        deadline = time.monotonic() + 300
        step = re.compile(rf"(?:^|\]:)step {warm_drill.WAIT_STEP}$", re.M)
        while not step.search(_logs(sched, app_id)):
            assert time.monotonic() < deadline, "the job did not train:\n" + _logs(sched, app_id)
            time.sleep(0.5)
        wait = [PY, str(warm_drill.KILLER), marker, "--ready", "2"]
        ready = subprocess.run([*wait, "--wait-only"], capture_output=True, text=True, timeout=400)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        killed = subprocess.run(
            [*wait, "--env", "XRUN_REPLICA_ID=1"], capture_output=True, text=True, timeout=400
        )
        assert killed.returncode == 0, killed.stdout + killed.stderr
        print(killed.stdout, file=sys.stderr)
        resp = _wait_end(sched, app_id, timeout=600)
        logs = _logs(sched, app_id)
    finally:
        subprocess.run(["scancel", app_id], check=False)
    assert resp.state == AppState.SUCCEEDED, f"{resp.msg}\n{logs[-4000:]}"
    assert resp.num_restarts == 0, resp.msg  # recovered in place: Slurm never requeued it
    resumed = warm_drill.check(logs, tmp_path / "result.json", ref)
    print(f"resumed after step {resumed}", file=sys.stderr)
    warm_drill.check_gone(warm_drill.armed(ready.stdout))
    warm_drill.check_gone(warm_drill.armed(killed.stdout))
