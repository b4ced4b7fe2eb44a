"""xrun.tracker's API (TorchX 0.7.0's) against the fsspec backend: app_run_from_env, the
embedded default, turning it off, the attempt and sweep metadata, torchx.tracker's stand-ins."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from xrun.tracker import AppRun, TrackerArtifact, app_run_from_env, build_trackers
from xrun.tracker.api import AppRunTrackableSource, _reset_for_tests
from xrun.tracker.base import TrackerSource
from xrun.tracker.fsspec_backend import FsspecTracker, create

JOB = "local_cwd://default/app-1"
_VARS = ("TORCHX_TRACKERS", "TORCHX_TRACKER_FSSPEC_CONFIG", "TORCHX_JOB_ID", "XRUN_RUN_ID")
_VARS += ("TORCHX_PARENT_RUN_ID", "RANK", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
_VARS += ("XRUN_TRIAL_INDEX", "XRUN_SWEEP_SIZE", "XRUN_SWEEP_LR", "XRUN_SWEEP_OPT")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """A clean tracking environment, its own state dir, and no cached run."""
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _reset_for_tests()
    yield monkeypatch
    _reset_for_tests()


def test_outside_a_job_no_backend_and_undefined_id(env: pytest.MonkeyPatch) -> None:
    run = app_run_from_env()
    assert run.job_id() == "<UNDEFINED>" and run.backends == []
    run.add_metadata(x=1)  # a no-op, as in TorchX
    assert app_run_from_env() is run  # one run per process


def test_embedded_default_under_the_state_dir(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("XRUN_RUN_ID", "local_cwd_default_app-1")
    run = app_run_from_env()
    [backend] = run.backends
    assert isinstance(backend, FsspecTracker)
    assert backend.root == str(tmp_path / "state" / "xrun" / "tracker")
    run.add_metadata(lr=0.1)
    assert create(None).metadata(JOB)["lr"] == 0.1


def test_empty_trackers_turns_tracking_off(env: pytest.MonkeyPatch) -> None:
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("XRUN_RUN_ID", "x")
    env.setenv("TORCHX_TRACKERS", "")
    assert app_run_from_env().backends == []


@pytest.mark.parametrize("form", ["dir", "file://", "memory://", "torchx-config-file"])
def test_api_on_fsspec_roots(env: pytest.MonkeyPatch, tmp_path: Path, form: str) -> None:
    root = tmp_path / "root"
    config = {
        "dir": str(root),
        "file://": f"file://{root}",
        "memory://": f"memory://xrun-test-{os.getpid()}",
    }.get(form)
    if config is None:
        conf = tmp_path / "tracker.conf"
        conf.write_text(f"# TorchX's format\nprotocol=file\nroot_path={root}\n")
        config = str(conf)
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("TORCHX_TRACKERS", "fsspec")
    env.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", config)
    env.setenv("TORCHX_PARENT_RUN_ID", "sweep://default/s1")
    run = app_run_from_env()
    run.add_metadata(lr=0.1, epochs=2)
    run.add_metadata(lr=0.2)
    run.add_artifact("model", "/ckpt/m.pt", {"epoch": 2})
    run.add_source("s3://data/v1", "dataset")
    [tracker] = build_trackers({"fsspec": config})
    md = tracker.metadata(JOB)
    assert (md["lr"], md["epochs"], md["restart_count"]) == (0.2, 2, 0)
    assert tracker.artifacts(JOB) == {"model": TrackerArtifact("model", "/ckpt/m.pt", {"epoch": 2})}
    assert sorted(tracker.sources(JOB), key=repr) == [
        TrackerSource("s3://data/v1", "dataset"),
        TrackerSource("sweep://default/s1", None),
    ]
    assert list(tracker.run_ids()) == [JOB]
    assert list(tracker.run_ids(parent_run_id="sweep://default/s1")) == [JOB]
    assert list(tracker.run_ids(parent_run_id="other")) == []
    assert AppRunTrackableSource(AppRun("s3://data/v1", run.backends), "dataset") in run.sources()
    if form != "memory://":
        assert root.is_dir()


def test_attempts_are_metadata_of_one_run(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("TORCHX_TRACKERS", "fsspec")
    env.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(tmp_path))
    for requeue, restart in ((0, 0), (0, 1), (1, 0)):
        env.setenv("SLURM_RESTART_COUNT", str(requeue))
        env.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        env.setenv("RANK", "0")
        _reset_for_tests()
        app_run_from_env()
        env.setenv("RANK", "1")  # another worker of the same attempt records nothing
        _reset_for_tests()
        app_run_from_env()
    tracker = create(str(tmp_path))
    assert list(tracker.run_ids()) == [JOB]
    md = tracker.metadata(JOB)
    assert sorted(k for k in md if k.startswith("attempt.")) == [
        "attempt.0.0",
        "attempt.0.1",
        "attempt.1.0",
    ]
    assert (md["restart_count"], md["slurm_restart_count"]) == (0, 1)
    assert len(os.listdir(next(tmp_path.iterdir()) / "metadata")) == 3


def test_a_sweep_trial_records_its_values(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("TORCHX_TRACKERS", "fsspec")
    env.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(tmp_path))
    env.setenv("XRUN_TRIAL_INDEX", "3")
    env.setenv("XRUN_SWEEP_SIZE", "4")
    env.setenv("XRUN_SWEEP_LR", "0.01")
    env.setenv("XRUN_SWEEP_OPT", "adam")
    app_run_from_env()
    md = create(str(tmp_path)).metadata(JOB)
    assert (md["sweep.trial"], md["sweep.lr"], md["sweep.opt"]) == (3, 0.01, "adam")
    assert "sweep.size" not in md


def test_a_tracker_that_cannot_be_built_is_left_out_with_a_message(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("TORCHX_TRACKERS", "nosuchbackend,fsspec")
    env.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(tmp_path))
    run = app_run_from_env()
    assert [type(b).__name__ for b in run.backends] == ["FsspecTracker"]
    assert "tracker nosuchbackend left out" in capsys.readouterr().err


def test_module_path_factory(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("TORCHX_JOB_ID", JOB)
    env.setenv("TORCHX_TRACKERS", "xrun.tracker.fsspec_backend:create")
    env.setenv("TORCHX_TRACKER_XRUN.TRACKER.FSSPEC_BACKEND:CREATE_CONFIG", str(tmp_path))
    [backend] = app_run_from_env().backends
    assert isinstance(backend, FsspecTracker) and backend.root == str(tmp_path)


# --------------------------------------------------------------------------- torchx.tracker
def test_torchx_tracker_under_the_component_stand_in() -> None:
    from xrun.torchx.compat import torchx_imports

    with torchx_imports():
        from torchx.tracker import app_run_from_env as theirs  # type: ignore[import-not-found]
        from torchx.tracker.api import AppRun as TheirRun  # type: ignore[import-not-found]
        from torchx.tracker.api import TrackerBase as TheirBase

    assert theirs is app_run_from_env and TheirRun is AppRun
    assert issubclass(FsspecTracker, TheirBase)
    assert "torchx" not in sys.modules  # only while the stand-in is in place


TORCHX_SCRIPT = """
from torchx.tracker import app_run_from_env
from torchx.tracker.api import TrackerBase
run = app_run_from_env()
run.add_metadata(loss=0.5)
print(run.job_id(), type(run.backends[0]).__name__, isinstance(run.backends[0], TrackerBase))
"""


def test_a_torchx_script_tracks_unchanged_in_a_worker(tmp_path: Path) -> None:
    """The agent's workers get xrun's torchx.tracker on their path when TorchX is missing."""
    from xrun.runtime.config import torchx_shim_path

    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    env.update(TORCHX_JOB_ID=JOB, XRUN_RUN_ID="r", XDG_STATE_HOME=str(tmp_path))
    shim = torchx_shim_path(env)
    assert shim is not None and torchx_shim_path({}) is None  # only in a job xrun started
    env["PYTHONPATH"] = shim
    r = subprocess.run(
        [sys.executable, "-c", TORCHX_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [JOB, "FsspecTracker", "True"]
    assert create(str(tmp_path / "xrun" / "tracker")).metadata(JOB)["loss"] == 0.5
