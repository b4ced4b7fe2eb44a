"""One tracker run per logical job on local_cwd: a 2x2 dist.ddp job whose workers fail three
times (the agents restart them in place) records into exactly one run, with every attempt as
metadata; ``xrun tracker list`` shows it out of the box (the embedded default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import xrun
from tests.helpers.paths import SCRIPTS


def test_2x2_with_3_restarts_is_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)  # the embedded default, no parent
    out = tmp_path / "out"
    out.mkdir()
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    r = xrun(
        "run", "--wait", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}",
        "dist.ddp", "-j", "2x2", "--max_retries", "3",
        "--script", str(SCRIPTS / "track_worker.py"), "--", "3", str(out),
        cwd=tmp_path, env=env, timeout=280,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    handle = r.stdout.splitlines()[0].strip()
    # 4 attempts of 4 workers, each of which saw the same run id and XRUN_RUN_ID
    ready = sorted(p.name for p in out.glob("ready.*"))
    assert ready == [f"ready.{rank}.{a}" for rank in range(4) for a in range(4)]
    ids = {p.read_text() for p in out.glob("ready.*")}
    app_id = handle.rsplit("/", 1)[1]
    assert ids == {f"local_cwd_default_{app_id} {handle}"}

    jobs = xrun("tracker", "list", "jobs", cwd=tmp_path, env=env)
    assert jobs.returncode == 0, jobs.stderr
    assert jobs.stdout.splitlines()[2:] == [handle]  # exactly one run
    md = xrun("tracker", "list", "metadata", handle, cwd=tmp_path, env=env)
    rows = dict(line.split(None, 1) for line in md.stdout.splitlines()[2:])
    assert sorted(k for k in rows if k.startswith("attempt.")) == [
        f"attempt.0.{a}" for a in range(4)
    ]
    # rank 0's agent's own failure count, as its worker saw it: 3, or less where it restarted
    # for a peer's failure first (a membership restart, which torchrun does not count; under
    # load all three can be: a stress run saw 0)
    seen = (out / "restart_count").read_text()
    assert rows["restart_count"] == seen and 0 <= int(seen) <= 3 and rows["done"] == "True"
    arts = xrun("tracker", "list", "artifacts", handle, cwd=tmp_path, env=env)
    assert arts.stdout.splitlines()[2].split()[:2] == ["result", str(out / "result.txt")]


SWEEP_TRIAL = """\
import os
from torchx.tracker import app_run_from_env
run = app_run_from_env()
run.add_metadata(loss=float(os.environ["XRUN_SWEEP_LR"]) * 10)
"""


def test_a_sweeps_trials_are_child_runs_with_their_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "trial.py").write_text(SWEEP_TRIAL)
    r = xrun(
        "run", "--wait", "--sweep", "lr=0.5,0.25", "-s", "local_cwd", "-cfg",
        f"log_dir={tmp_path / 'logs'}", "dist.ddp", "-j", "1x1", "--cpu", "1",
        "--script", "trial.py",
        cwd=tmp_path, env=env, timeout=170,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = r.stdout.splitlines()[0].strip()
    jobs = xrun("tracker", "list", "jobs", "--parent-run-id", sweep, cwd=tmp_path, env=env)
    assert jobs.returncode == 0, jobs.stderr
    trials = jobs.stdout.splitlines()[2:]
    assert len(trials) == 2 and all(t.startswith("local_cwd://default/") for t in trials)
    seen = {}
    for t in trials:
        md = xrun("tracker", "list", "metadata", t, cwd=tmp_path, env=env).stdout
        rows = dict(line.split(None, 1) for line in md.splitlines()[2:])
        seen[rows["sweep.trial"]] = (rows["sweep.lr"], rows["loss"])
    assert seen == {"0": ("0.5", "5"), "1": ("0.25", "2.5")}  # tabulate prints 5.0 as 5
    # the sweep's own handle is no run: only its trials are
    assert sweep not in xrun("tracker", "list", "jobs", cwd=tmp_path, env=env).stdout

    # xrun status SWEEP: each trial's numeric metadata as columns, sorted on request
    def rows(*args: str) -> list[list[str]]:
        r = xrun("status", sweep, *args, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["trial", "lr"])
        assert lines[header].split() == [
            "trial", "lr", "state", "exit", "host", "duration", "loss", "id",
        ]  # fmt: skip
        return [ln.split() for ln in lines[header + 1 :] if ln[:1] == " " or ln[:1].isdigit()]

    assert [(r[0], r[6]) for r in rows()] == [("0", "5"), ("1", "2.5")]
    assert [r[0] for r in rows("--sort", "loss")] == ["1", "0"]
    assert [r[0] for r in rows("--sort", "loss", "--desc")] == ["0", "1"]
    assert [r[0] for r in rows("--sort", "lr")] == ["1", "0"]
    bad = xrun("status", sweep, "--sort", "acc", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "--sort acc" in bad.stderr and "valid: lr, loss" in bad.stderr


TRACK_PLAIN = """\
from torchx.tracker import app_run_from_env
run = app_run_from_env()
run.add_metadata(lr=0.1)
run.add_source("dataset")
print("tracked", run.job_id())
"""


def test_utils_python_script_imports_torchx_tracker_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gap N16: TorchX's documented pattern in a role run without xrun's agent
    (`utils.python --script track.py`) failed with `No module named 'torchx'`; the role now
    gets the worker-side stand-in on its PYTHONPATH, after the user's own entries."""
    for var in ("TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "track.py").write_text(TRACK_PLAIN)
    (tmp_path / "mine").mkdir()
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    r = xrun(
        "run", "--wait", "--log", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}",
        "utils.python", "--env", f"PYTHONPATH={tmp_path / 'mine'}", "--script", "track.py",
        cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    handle = r.stdout.splitlines()[0].strip()
    assert f"tracked {handle}" in r.stdout + r.stderr
    md = xrun("tracker", "list", "metadata", handle, cwd=tmp_path, env=env)
    assert "lr" in md.stdout and "0.1" in md.stdout, md.stdout + md.stderr
