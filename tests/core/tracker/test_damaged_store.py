"""Reading a shared tracker dir that holds what no tracker wrote (issue #31: P6, P12, M9, M10,
M12, M5): a real 2-trial sweep on local_cwd, then its store tampered with. ``xrun status
SWEEP`` and ``xrun tracker list`` never hang, never traceback, and say what they left out."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import XRUN
from xrun.tracker.fsspec_backend import encode_run_id

TRIAL = """\
import os
from xrun.tracker import app_run_from_env
big = os.environ["XRUN_SWEEP_V"] == "big"
app_run_from_env().add_metadata(loss=10**400 if big else 0.5, acc=7)
"""
READ_TIMEOUT_S = 60  # a hang is a failure, not a stuck suite


class Sweep:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHX_", "XRUN_"))}
        self.env.update(HOME=str(root), XDG_STATE_HOME=str(root / "state"), NO_COLOR="1")
        self.handle = ""
        self.trials: list[str] = []

    def xrun(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [XRUN, *args], cwd=self.root, env={**self.env, **env}, capture_output=True,
            text=True, timeout=READ_TIMEOUT_S,
        )  # fmt: skip

    @property
    def store(self) -> Path:
        return self.root / "state" / "xrun" / "tracker"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    s = Sweep(tmp_path_factory.mktemp("sweep"))
    (s.root / "trial.py").write_text(TRIAL)
    r = subprocess.run(
        [
            XRUN, "run", "--wait", "--sweep", "v=big,small", "-s", "local_cwd", "-cfg",
            f"log_dir={s.root / 'logs'}", "dist.ddp", "-j", "1x1", "--script", "trial.py",
        ],
        cwd=s.root, env=s.env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s.handle = r.stdout.splitlines()[0].strip()
    jobs = s.xrun("tracker", "list", "jobs", "--parent-run-id", s.handle)
    s.trials = jobs.stdout.splitlines()[2:]
    assert len(s.trials) == 2, jobs
    yield s


def _clean(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_a_huge_integer_metric_leaves_the_table_readable(sweep: Sweep) -> None:
    """P6: loss=10**400 is a valid JSON integer and no float: that cell is blank."""
    for extra in ([], ["--sort", "loss"], ["--sort", "acc", "--desc"]):
        r = sweep.xrun("status", sweep.handle, *extra)
        _clean(r)
        assert r.returncode == 0, r.stderr
        head = next(ln for ln in r.stdout.splitlines() if ln.startswith("trial"))
        assert head.split()[-3:] == ["acc", "loss", "id"]
        rows = [ln for ln in r.stdout.splitlines() if "localhost" in ln]
        assert len(rows) == 2 and sum(" 0.5 " in ln for ln in rows) == 1, r.stdout
    md = sweep.xrun("tracker", "list", "metadata", sweep.trials[0])
    _clean(md)
    assert (
        md.returncode == 0
        and ("1" + "0" * 400)
        in md.stdout + sweep.xrun("tracker", "list", "metadata", sweep.trials[1]).stdout
    )


def test_sort_by_an_empty_key_is_refused(sweep: Sweep) -> None:
    """M9: --sort '' is an unknown key like any other."""
    r = sweep.xrun("status", sweep.handle, "--sort", "")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--sort '': no metric or parameter" in r.stderr and "valid: v, acc, loss" in r.stderr


def test_a_fifo_and_a_symlink_loop_in_the_store(sweep: Sweep) -> None:
    """P12: a FIFO (was: every reader hung) and a symlink loop (was: a traceback, ELOOP) in
    a run's dirs and at the root are skipped like any unreadable entry."""
    run = sweep.store / encode_run_id(sweep.trials[0])
    made = [
        run / "metadata" / "1",
        run / "artifacts" / "1",
        run / "sources" / encode_run_id("local_cwd://default/x"),
        sweep.store / encode_run_id("local_cwd://default/fifo"),
    ]
    loops = [run / "metadata" / "993", sweep.store / encode_run_id("local_cwd://default/loop")]
    (run / "artifacts").mkdir(exist_ok=True)
    for path in made:
        os.mkfifo(path)
    for path in loops:
        os.symlink(path.name, path)  # points at itself: ELOOP
    try:
        status = sweep.xrun("status", sweep.handle)
        _clean(status)
        assert status.returncode == 0 and "loss" in status.stdout, status.stderr
        for args in (
            ["jobs"],
            ["jobs", "--parent-run-id", sweep.handle],
            ["metadata", sweep.trials[0]],
            ["artifacts", sweep.trials[0]],
        ):
            r = sweep.xrun("tracker", "list", *args)
            _clean(r)
            assert r.returncode == 0, (args, r.stderr)
        jobs = sweep.xrun("tracker", "list", "jobs").stdout.splitlines()[2:]
        assert sorted(jobs) == sorted(sweep.trials)
        md = sweep.xrun("tracker", "list", "metadata", sweep.trials[0]).stdout
        assert "acc" in md
    finally:
        for path in made + loops:
            path.unlink()


def test_an_unknown_run_id_is_said_so(sweep: Sweep) -> None:
    """M10: not an empty table, one line naming the run and where to find run ids."""
    for what in ("metadata", "artifacts"):
        r = sweep.xrun("tracker", "list", what, "local_cwd://default/nosuch-1")
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "has no run 'local_cwd://default/nosuch-1'" in r.stderr and r.stdout == ""


def test_metric_columns_left_out_are_said_so_without_the_password(sweep: Sweep) -> None:
    """M12: the configured tracker is unreachable: the table, and one line saying why its
    metric columns are missing; M5: the URL's password is masked."""
    r = sweep.xrun(
        "status",
        sweep.handle,
        TORCHX_TRACKERS="mlflow",
        TORCHX_TRACKER_MLFLOW_CONFIG="http://user:s3cr3t@127.0.0.1:1#x",
    )
    _clean(r)
    assert r.returncode == 0 and "SUCCEEDED" in r.stdout, r.stderr
    assert "loss" not in r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: metric columns left out"), lines
    assert "s3cr3t" not in r.stderr and "user:***@127.0.0.1" in r.stderr
