# ruff: noqa: F811  (the sched fixture is imported, then named by the tests)
"""One tracker run per logical job on the real Slurm cluster: a 2-node dist.ddp job restarted
in place by its agents, then requeued by Slurm, records into ONE run with every attempt."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.schedulers.slurm.test_integration import (
    _release_begin_time,
    read,
    sched,  # noqa: F401  (the fixture)
    slurm_cluster,  # noqa: F401  (the session fixture)
)
from xrun.components.dist import ddp
from xrun.config import Config
from xrun.runner import Runner
from xrun.schedulers.slurm import SlurmScheduler
from xrun.specs import AppState
from xrun.tracker.fsspec_backend import create

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

# Attempt (requeue 0, round 0) fails (an in-place restart); (0, 1) waits to be requeued;
# (1, 0) succeeds. The rendezvous round, not TORCHELASTIC_RESTART_COUNT, names a start: the
# two agents' own restart counts may differ (a membership restart counts for neither). Each worker first opens the run and passes a barrier, so rank 0's record of
# the attempt is written before anything ends it.
WORKER = """\
import os, sys, time
from torchx.tracker import app_run_from_env
out = sys.argv[1]
run = app_run_from_env()
rank, n = os.environ["RANK"], int(os.environ["WORLD_SIZE"])
attempt = f"{os.environ.get('SLURM_RESTART_COUNT', '0')}.{os.environ['XRUN_ROUND']}"
with open(os.path.join(out, f"ready.{rank}.{attempt}"), "w") as f:
    f.write(os.environ["XRUN_RUN_ID"] + " " + run.job_id())
while sum(os.path.exists(os.path.join(out, f"ready.{r}.{attempt}")) for r in range(n)) < n:
    time.sleep(0.05)
if attempt == "0.0":
    sys.exit(1)
if attempt == "0.1":
    time.sleep(200)
if rank == "0":
    run.add_metadata(done=True)
"""


def test_restart_and_requeue_are_one_run(
    sched: SlurmScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, out = tmp_path / "tracker", tmp_path / "out"
    out.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(root))
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    app = ddp(str(out), script="worker.py", j="2x1", cpu=1, memMB=256, max_retries=1)
    job = Runner("test", config=Config()).with_job_env(app, "slurm")
    app_id = sched.submit(job, {}, workspace=str(tmp_path))
    handle = f"slurm://test/{app_id}"
    deadline = time.monotonic() + 120
    while not all((out / f"ready.{r}.0.1").exists() for r in range(2)):
        assert time.monotonic() < deadline, read(tmp_path / "slurm-logs" / app_id / "trainer")
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", app_id], check=True)
    deadline = time.monotonic() + 200
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
            break
        assert time.monotonic() < deadline, f"job {app_id} stuck: {resp}"
        time.sleep(0.3)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    ready = sorted(p.name for p in out.glob("ready.*"))
    assert ready == [f"ready.{r}.{a}" for r in range(2) for a in ("0.0", "0.1", "1.0")]
    assert {p.read_text() for p in out.glob("ready.*")} == {f"slurm_test_{app_id} {handle}"}
    tracker = create(str(root))
    assert list(tracker.run_ids()) == [handle]  # ONE run
    md = tracker.metadata(handle)
    assert sorted(k for k in md if k.startswith("attempt.")) == [
        "attempt.0.0",
        "attempt.0.1",
        "attempt.1.0",
    ]
    assert (md["slurm_restart_count"], md["restart_count"], md["done"]) == (1, 0, True)


SWEEP_TRIAL = """\
import os
from torchx.tracker import app_run_from_env
app_run_from_env().add_metadata(loss=float(os.environ["XRUN_SWEEP_LR"]) * 10)
"""


def test_array_tasks_are_child_runs_of_the_sweep(
    slurm_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers.cli import xrun
    from tests.helpers.waiting import wait_for

    root = tmp_path / "tracker"
    (tmp_path / "trial.py").write_text(SWEEP_TRIAL)
    env = {"TORCHX_TRACKERS": "fsspec", "TORCHX_TRACKER_FSSPEC_CONFIG": str(root)}
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    r = xrun(
        "run", "-s", "slurm", "--sweep", "lr=0.5,0.25", "dist.ddp", "-j", "1x1", "--cpu", "1",
        "--memMB", "256", "--script", "trial.py",
        cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    sweep = r.stdout.strip()
    try:

        def ended() -> bool:
            text = xrun("status", sweep, cwd=tmp_path, env=env).stdout
            return "State: SUCCEEDED" in text or "State: FAILED" in text

        wait_for(ended, timeout=150, what=f"{sweep} ends")
    finally:
        subprocess.run(["scancel", sweep.rsplit("/", 1)[1]], check=False, capture_output=True)
    jobs = xrun("tracker", "list", "jobs", "--parent-run-id", sweep, cwd=tmp_path, env=env)
    assert jobs.returncode == 0, jobs.stderr
    assert len(jobs.stdout.splitlines()[2:]) == 2, jobs.stdout
    status = xrun("status", sweep, "--sort", "loss", cwd=tmp_path, env=env).stdout
    assert "State: SUCCEEDED" in status, status
    table = [
        c
        for c in map(str.split, status.splitlines())
        if c[:1] == ["trial"] or c[:1] and c[0].isdigit()
    ]
    assert table[0][:7] == ["trial", "lr", "state", "exit", "host", "duration", "loss"], status
    assert [(row[0], row[6]) for row in table[1:]] == [("1", "2.5"), ("0", "5")], status


TRACK_PLAIN = """\
from torchx.tracker import app_run_from_env
app_run_from_env().add_metadata(lr=0.1)
"""


def test_a_utils_python_role_imports_torchx_tracker_unchanged(
    slurm_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gap N16 on Slurm: a role run without xrun's agent gets the worker-side stand-in on its
    PYTHONPATH too (TorchX's documented `from torchx.tracker import app_run_from_env`)."""
    from tests.helpers.cli import xrun

    root = tmp_path / "tracker"
    (tmp_path / "track.py").write_text(TRACK_PLAIN)
    env = {"TORCHX_TRACKERS": "fsspec", "TORCHX_TRACKER_FSSPEC_CONFIG": str(root)}
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    r = xrun(
        "run", "--wait", "-s", "slurm", "utils.python", "--memMB", "256", "--script", "track.py",
        cwd=tmp_path, env=env, timeout=150,
    )  # fmt: skip
    handle = r.stdout.splitlines()[0].strip() if r.stdout else ""
    logs = "".join(read(p) for p in (tmp_path / "slurm-logs").rglob("*.std*"))
    assert r.returncode == 0, r.stderr[-2000:] + logs[-2000:]
    assert create(str(root)).metadata(handle)["lr"] == 0.1
