"""Trials compared by what they tracked: the numeric metadata, the order, the columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import Env
from xrun.errors import UsageError
from xrun.specs import AppState
from xrun.sweeps.metrics import numeric, sort_trials, trial_metrics
from xrun.sweeps.status import SweepStatus, TrialStatus
from xrun.tracker.fsspec_backend import create

SWEEP = "local_cwd://default/s-1"


def _trials() -> list[TrialStatus]:
    return [
        TrialStatus(i, {"lr": lr}, AppState.SUCCEEDED, app_id=f"t-{i}")
        for i, lr in enumerate(("0.1", "0.01", "1"))
    ]


def test_numeric_leaves_out_xrun_keys_bools_and_text() -> None:
    md = {"loss": 0.5, "acc": 1, "ok": True, "name": "x", "nan": float("nan")}
    md.update({"attempt.0.0": 1.0, "restart_count": 2, "sweep.lr": 0.1})
    assert numeric(md) == {"loss": 0.5, "acc": 1.0}


def test_metrics_from_child_runs_and_from_trial_handles(tmp_path: Path) -> None:
    t = create(str(tmp_path))
    t.add_source("local_cwd://default/t-0", SWEEP)
    t.add_metadata("local_cwd://default/t-0", **{"sweep.trial": 0, "loss": 0.3})
    t.add_metadata("local_cwd://default/t-2", loss=0.1)  # no parent: found by its handle
    t.add_source("local_cwd://default/other", "local_cwd://default/s-2")
    t.add_metadata("local_cwd://default/other", **{"sweep.trial": 1, "loss": 9.0})
    assert trial_metrics(SWEEP, _trials(), t) == {0: {"loss": 0.3}, 2: {"loss": 0.1}}


def test_sort_by_metric_or_param_missing_last() -> None:
    metrics = {0: {"loss": 0.3}, 2: {"loss": 0.1}}
    by = [t.index for t in sort_trials(_trials(), metrics, ["lr"], "loss")]
    assert by == [2, 0, 1]
    assert [t.index for t in sort_trials(_trials(), metrics, ["lr"], "loss", desc=True)] == [
        0,
        2,
        1,
    ]
    assert [t.index for t in sort_trials(_trials(), metrics, ["lr"], "lr")] == [1, 0, 2]
    with pytest.raises(UsageError, match=r"--sort acc: .*valid: lr, loss"):
        sort_trials(_trials(), metrics, ["lr"], "acc")


def test_table_has_a_right_aligned_column_per_metric() -> None:
    st = SweepStatus(SWEEP, "s", ["lr"], _trials(), metrics={0: {"loss": 0.3}, 2: {"loss": 12.5}})
    lines = st.format(now=0).splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("trial"))
    assert lines[head].split() == ["trial", "lr", "state", "exit", "host", "duration", "loss", "id"]
    loss_end = lines[head].index("loss") + len("loss")
    assert lines[head + 1][:loss_end].endswith(" 0.3")
    assert lines[head + 2][:loss_end].strip().endswith("SUCCEEDED")  # no value: blank
    assert lines[head + 3][:loss_end].endswith("12.5")


def test_sort_on_an_app_that_is_no_sweep(tmp_path: Path) -> None:
    r = Env(tmp_path).run("status", "local_cwd://default/nope-1", "--sort", "loss")
    assert r.returncode == 2 and "is no sweep" in r.stderr and len(r.stderr.splitlines()) == 1
