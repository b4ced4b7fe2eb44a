"""The mlflow backend against a real ``mlflow server`` (tests/helpers/mlflow_server.py):
metadata as params/tags, artifacts uploaded, sources as parent/child runs, one MLflow run per
job across restarts, and the CLI reading it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.mlflow_server import mlflow_server  # noqa: F401 - the fixture
from xrun.tracker.base import TrackerArtifact, TrackerSource
from xrun.tracker.mlflow_backend import JOB_TAG, MLflowTracker, create

# The module's server starts in the first test's setup: minutes under load (mlflow_server.py).
pytestmark = pytest.mark.timeout(600)

JOB = "local_cwd://default/trial-1"
SWEEP = "local_cwd://default/sweep-1"


def test_api_maps_to_params_tags_artifacts_and_parent_runs(
    mlflow_server: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    from mlflow.tracking import MlflowClient

    t = create(f"{mlflow_server}#api")
    t.add_metadata(JOB, lr=0.1, epochs=3, name="t1")
    t.add_metadata(JOB, lr=0.2)  # a param cannot change: the new value is a tag
    model = tmp_path / "model.txt"
    model.write_text("weights")
    t.add_artifact(JOB, "model", str(model), {"epoch": 3})
    t.add_source(JOB, SWEEP)
    t.add_source(JOB, "s3://data/v1", "dataset")

    again = create(f"{mlflow_server}#api")  # another process: found by the job's tag
    assert again.metadata(JOB) == {"lr": 0.2, "epochs": 3, "name": "t1"}
    assert again.artifacts(JOB) == {"model": TrackerArtifact("model", str(model), {"epoch": 3})}
    assert again.sources(JOB) == [
        TrackerSource(SWEEP, None),
        TrackerSource("s3://data/v1", "dataset"),
    ]
    assert again.sources(JOB, "dataset") == [TrackerSource("s3://data/v1", "dataset")]
    assert sorted(again.run_ids()) == sorted([JOB, SWEEP])
    assert again.run_ids(parent_run_id=SWEEP) == [JOB]

    client = MlflowClient(mlflow_server)
    run = client.get_run(again._find(JOB) or "")
    assert run.data.params == {"lr": "0.1", "epochs": "3", "name": "t1"}
    assert run.data.tags["lr"] == "0.2"
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags[JOB_TAG] == SWEEP
    assert [a.path for a in client.list_artifacts(run.info.run_id, "model")] == ["model/model.txt"]


JOB_SCRIPT = """
import os
from xrun.tracker import app_run_from_env
run = app_run_from_env()
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "1":
    run.add_metadata(loss=0.5)
"""


def test_restarts_write_into_one_mlflow_run(mlflow_server: str, tmp_path: Path) -> None:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHX_", "XRUN_"))}
    env.update(
        TORCHX_JOB_ID="slurm://default/77",
        TORCHX_TRACKERS="mlflow",
        TORCHX_TRACKER_MLFLOW_CONFIG=f"{mlflow_server}#restarts",
        TORCHX_PARENT_RUN_ID=SWEEP,
        RANK="0",
        XRUN_TRACKER_TIMEOUT="60",  # the server shares this loaded machine's cores
    )
    for attempt in ("0", "1"):
        env["TORCHELASTIC_RESTART_COUNT"] = attempt
        r = subprocess.run(
            [sys.executable, "-c", JOB_SCRIPT], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    t = create(f"{mlflow_server}#restarts")
    # the parent's run, and ONE run of the job
    assert sorted(t.run_ids()) == sorted([SWEEP, "slurm://default/77"])
    md = t.metadata("slurm://default/77")
    assert {"attempt.0.0", "attempt.0.1"} <= set(md) and md["restart_count"] == 1
    assert md["loss"] == 0.5


def test_cli_lists_from_mlflow(mlflow_server: str, tmp_path: Path) -> None:  # noqa: F811
    create(f"{mlflow_server}#cli").add_metadata(JOB, acc=0.75)
    env = Env(tmp_path)
    (env.cwd / ".xrunconfig").write_text(
        f"[torchx:tracker]\nmlflow =\n[tracker:mlflow]\nconfig = {mlflow_server}#cli\n"
    )
    r = env.run("tracker", "list", "jobs", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["JOB ID", "-" * len(JOB), JOB]
    r = env.run("tracker", "list", "metadata", JOB, timeout=120)
    assert r.stdout.splitlines()[2].split() == ["acc", "0.75"]


def test_is_a_tracker_base() -> None:
    from xrun.tracker import TrackerBase

    assert issubclass(MLflowTracker, TrackerBase)


@pytest.mark.parametrize("config", ["http://127.0.0.1:1#x", "https://127.0.0.1:1"])
def test_unreachable_uri_refused_at_submit(config: str, tmp_path: Path) -> None:
    env = Env(tmp_path)
    (env.cwd / ".xrunconfig").write_text(
        f"[torchx:tracker]\nmlflow =\n[tracker:mlflow]\nconfig = {config}\n"
    )
    r = env.run("run", "--dryrun", "-s", "local_cwd", "utils.echo")
    assert r.returncode == 2 and "[tracker:mlflow] config" in r.stderr and "unreachable" in r.stderr


RACER = """
import os, sys, time
from xrun.tracker.mlflow_backend import create
t = create(sys.argv[1])
open(os.path.join(sys.argv[2], f"ready.{sys.argv[3]}"), "w").close()
while not os.path.exists(os.path.join(sys.argv[2], "go")):
    time.sleep(0.01)
t.add_metadata("local_cwd://default/raced", **{f"w{sys.argv[3]}": 1})
"""


def test_workers_creating_the_run_at_once_leave_one(mlflow_server: str, tmp_path: Path) -> None:  # noqa: F811
    config = f"{mlflow_server}#race"
    create(config)  # the experiment exists before the race
    procs = [
        subprocess.Popen([sys.executable, "-c", RACER, config, str(tmp_path), str(i)])
        for i in range(3)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready.*"))) < 3:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    (tmp_path / "go").touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    t = create(config)
    assert t.run_ids() == ["local_cwd://default/raced"]
    assert t.metadata("local_cwd://default/raced") == {"w0": 1, "w1": 1, "w2": 1}


def test_a_run_that_shows_up_late_with_an_earlier_start_loses_nothing(mlflow_server: str) -> None:  # noqa: F811
    """The stress run's interleaving, forced: worker C creates the job's run and writes into it;
    worker A's run, whose creation was still on its way, shows up with an earlier start (so A
    keeps it, and B, coming last, deletes its own and writes into A's); then a run a worker was
    writing into is deleted under it. Every value stays readable, the job is listed once. (The
    job used to read as A's run alone: {w0, w1}, and a write into a deleted run raised.)"""
    config = f"{mlflow_server}#late"
    job = "local_cwd://default/late"
    c = create(config)
    c.add_metadata(job, w2=1)
    c.add_source(job, "local_cwd://default/sweep-c", "data")
    started = c.client.get_run(c._find(job) or "").info.start_time

    a = create(config)
    create_run = a.client.create_run

    def earlier(experiment_id: str, **kw: object) -> object:  # its create was sent first
        return create_run(experiment_id, start_time=started - 1000, **kw)  # type: ignore[arg-type]

    a.client.create_run = earlier  # type: ignore[method-assign]
    find, looked = a._find, []

    def first_blind(job_id: str) -> str | None:  # its first look came before C's run was there
        looked.append(job_id)
        return None if len(looked) == 1 else find(job_id)

    a._find = first_blind  # type: ignore[method-assign]
    a.add_metadata(job, w0=1)
    b = create(config)
    b.add_metadata(job, w1=1)
    assert a._find(job) == b._find(job) != c._find(job)

    fresh = create(config)
    assert fresh.metadata(job) == {"w0": 1, "w1": 1, "w2": 1}
    assert sorted(fresh.run_ids()) == [job, "local_cwd://default/sweep-c"]  # the job once
    assert [s.source_run_id for s in fresh.sources(job)] == ["local_cwd://default/sweep-c"]

    # A's run deleted under B, which still writes into it: its next write lands in the main run
    a.client.delete_run(a._find(job) or "")
    b.add_metadata(job, late=2)
    assert create(config).metadata(job) == {"w0": 1, "w1": 1, "w2": 1, "late": 2}
