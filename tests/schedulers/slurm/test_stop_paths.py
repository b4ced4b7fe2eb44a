"""Every other way a stop reaches a Slurm job (issue #33; a preemption: test_preemption.py),
each on the suite's real cluster with a 2x2 DDP job (tests/scripts/stop_drill.py, gloo on CPU):

* ``scancel --signal=TERM`` (the tasks only, as a site's drain script): a stop, one requeue,
  a resume from the agreed step;
* the time limit's warning (``-cfg time=5 signal=USR2@180``, sent as ``--signal=B:USR2@180`` to
  the batch shell, which passes it on): the same;
* ``xrun cancel`` (``scancel``: SIGTERM to every process, SIGKILL ``KillWait`` s later; that is
  the grace): every rank saves the same step, the job ends CANCELLED, never requeued;
* a preemption with ``SlurmctldParameters=preempt_send_user_signal`` (the tasks get the
  ``--signal`` warning instead of SIGTERM): the same one requeue and resume. That setting is
  applied to the shared cluster only for this test and taken away after it.

Each asserts: every rank saw the stop within a second of the first, all stopped after the same
step with a complete checkpoint, the resumed attempt started from that step.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.net import free_port
from tests.helpers.paths import REPO
from tests.helpers.slurm import SlurmCluster
from tests.helpers.stop_drill import DRILL, ROLE, check_stopped, drill_lines, wait_ready
from tests.helpers.waiting import wait_for
from tests.schedulers.slurm.test_preemption import _wait_end
from xrun.components.dist import ddp
from xrun.schedulers.api import Stream
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

slurm_cluster = slurm_fixture.slurm_cluster
NAME = "xrun-stop-path"


@pytest.fixture
def sched(slurm_cluster: SlurmCluster) -> Iterator[SlurmScheduler]:
    s = create_scheduler("test")
    yield s
    subprocess.run(["scancel", f"--name={NAME},{NAME}-preemptor"], check=False)


def _submit(
    sched: SlurmScheduler, tmp: Path, *args: str, retries: int = 1, **cfg: object
) -> tuple[str, Path]:
    out = tmp / "out"
    out.mkdir()
    (tmp / DRILL.name).write_text(DRILL.read_text())
    app = ddp(
        str(out), *args, script=DRILL.name, j="2x2", cpu=2, memMB=512, max_retries=retries,
        rdzv_port=free_port(),
    )  # fmt: skip
    app.name = NAME
    app_id = sched.submit(app, {"job_name": NAME, "exclusive": True, **cfg}, workspace=str(tmp))
    return app_id, out


def _logs(sched: SlurmScheduler, app_id: str) -> str:
    return "".join("".join(sched.log_iter(app_id, ROLE, k)) for k in (0, 1))


def _last_seen(out: Path) -> float:
    return max(float(p.read_text()) for p in out.glob("seen.*"))


def _check_resumed(sched: SlurmScheduler, app_id: str, out: Path, t0: float | None) -> str:
    resp = _wait_end(sched, app_id, timeout=400)
    logs = _logs(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, f"{resp.msg}\n{logs}"
    assert resp.num_restarts == 1, resp.msg  # requeued exactly once
    stopped = check_stopped(out, 4, t0)
    assert drill_lines(logs, "stopping at step") == [stopped.step] * 4, logs
    assert drill_lines(logs, "resuming from step") == [stopped.step] * 4, logs
    assert logs.count(f"done at step {stopped.step + 10}") == 4, logs
    return resp.msg


def _preempt(app_id: str) -> None:
    """A job on `high` that needs the xrun job's nodes: Slurm preempts the xrun job for it."""
    nodes = subprocess.run(
        ["squeue", "-h", "-j", app_id, "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-N2", f"--nodelist={nodes}",
         "-J", f"{NAME}-preemptor", "-o", "/dev/null", "--wrap", "sleep 1"],
        check=True, capture_output=True,
    )  # fmt: skip


def test_scancel_signal_term_stops_at_one_step_requeues_once_and_resumes(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    app_id, out = _submit(sched, tmp_path)
    wait_ready(out, 4)
    t0 = time.time()
    subprocess.run(["scancel", "--signal=TERM", app_id], check=True)
    msg = _check_resumed(sched, app_id, out, None)  # timed from the first rank, as above
    assert "preempted 1 time(s)" in msg, msg
    assert _last_seen(out) - t0 < 10


def test_the_time_limit_warning_stops_at_one_step_requeues_once_and_resumes(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    # Slurm sends the warning when at most 180 s (+ up to one 30 s check) are left of the 5
    # minutes: 60..120 s in, after the ranks have started. Only the batch shell gets it (B:).
    app_id, out = _submit(sched, tmp_path, time="5", signal="USR2@180")
    wait_ready(out, 4)
    msg = _check_resumed(sched, app_id, out, None)
    assert "preempted 1 time(s)" in msg and "USR2" in msg, msg


def test_xrun_cancel_saves_one_step_inside_killwait_and_is_not_requeued(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    app_id, out = _submit(sched, tmp_path)
    wait_ready(out, 4)
    t0 = time.time()
    sched.cancel(app_id)
    resp = _wait_end(sched, app_id)
    assert resp.state == AppState.CANCELLED, resp.msg
    # Timed from the first rank: from the scancel on, Slurm's own delivery (slurmctld, each
    # slurmd) comes first, 1.3 s once with two other jobs' 8 ranks on this 2-core host.
    check_stopped(out, 4)
    assert _last_seen(out) - t0 < 10
    time.sleep(3)  # a requeue would show by now
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.CANCELLED and resp.num_restarts == 0


@pytest.fixture
def preempt_send_user_signal(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """The shared cluster with preempt_send_user_signal, for this test only (scontrol
    reconfigure: running jobs are kept)."""
    script = str(REPO / "scripts" / "slurm-cluster.sh")
    env = {**os.environ, "XRUN_SLURM_PREEMPT_SIGNAL": "1"}
    subprocess.run(["bash", script, "up"], env=env, check=True, capture_output=True, timeout=300)
    try:
        yield
    finally:
        subprocess.run(["bash", script, "up"], check=True, capture_output=True, timeout=300)


def test_a_preemption_with_preempt_send_user_signal_requeues_once_and_resumes(
    preempt_send_user_signal: None, sched: SlurmScheduler, tmp_path: Path
) -> None:
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True
    ).stdout
    assert "preempt_send_user_signal" in config
    app_id, out = _submit(sched, tmp_path, partition="low", signal="USR2@90")
    wait_ready(out, 4)
    t0 = time.time()
    _preempt(app_id)
    # The warning goes to the batch shell (B:), which passes it on: one hop more than a
    # SIGTERM to the tasks; timed from the first rank that saw it.
    msg = _check_resumed(sched, app_id, out, None)
    assert "preempted 1 time(s)" in msg and "USR2" in msg, msg
    first_seen = min(float(p.read_text()) for p in out.glob("seen.*"))
    print(f"preempt_send_user_signal: the first rank saw it {first_seen - t0:.2f} s after sbatch")


def test_status_and_log_show_every_preemption_and_attempt(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    # Two real preemptions, each followed by a requeue: status names both (attempt and time),
    # the replica logs mark where each attempt starts.
    app_id, out = _submit(sched, tmp_path, "10", "2", retries=2, partition="low")
    for attempt in (0, 1):
        deadline = time.monotonic() + 300
        while len(list(out.glob("ready.*"))) < 4:
            resp = sched.describe(app_id)
            assert resp is not None and time.monotonic() < deadline, resp
            if "reason=BeginTime" in resp.msg:  # Slurm's ~120 s hold of a requeued job
                subprocess.run(["scontrol", "update", f"JobId={app_id}", "StartTime=now"])
            time.sleep(0.5)
        _preempt(app_id)
        wait_for(lambda: len(list(out.glob("stopped.*"))) == 4, 120, f"stop {attempt}")
        check_stopped(out, 4)
        for p in [*out.glob("ready.*"), *out.glob("stopped.*"), *out.glob("seen.*")]:
            p.unlink()
    resp = _wait_end(sched, app_id, timeout=400)
    assert resp.state == AppState.SUCCEEDED and resp.num_restarts == 2, resp.msg
    assert re.search(
        r"preempted 2 time\(s\): attempt 0 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(TERM\), "
        r"attempt 1 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(TERM\)$",
        resp.msg,
    ), resp.msg
    for k in (0, 1):
        log = "".join(sched.log_iter(app_id, ROLE, k, streams=Stream.STDOUT))
        marks = re.findall(
            rf"^==== xrun: attempt (\d) of job {app_id} \(requeued\) on c\d at ", log, re.M
        )
        assert marks == ["1", "2"], log
        # in order: attempt 0's stop, the mark of 1, its resume and stop, the mark of 2, ...
        order = [
            m.group(0) for m in re.finditer(r"==== xrun: attempt \d|stopping|resuming|done", log)
        ]
        assert order == [
            *["stopping"] * 2, "==== xrun: attempt 1", *["resuming"] * 2, *["stopping"] * 2,
            "==== xrun: attempt 2", *["resuming"] * 2, *["done"] * 2,
        ], log  # fmt: skip
