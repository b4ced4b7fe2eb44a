"""Races between a sweep's ``status`` and its supervisor's last write, forced at the racy
point (a status on a busy machine can be descheduled for any length of time there)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from xrun.schedulers.api import DescribeAppResponse
from xrun.specs import AppState
from xrun.sweeps import records, trials
from xrun.sweeps.supervisor import cancel_everything, initial_state, save_state


class _Sched:
    """The one scheduler call ``status`` makes: a trial's app ended CANCELLED."""

    backend = "local_cwd"
    session_name = "test"

    def describe(self, app_id: str) -> DescribeAppResponse:
        return DescribeAppResponse(app_id, AppState.CANCELLED)


def _spec() -> dict[str, Any]:
    plan = {"name": "race", "params": ["w"], "trials": [{"w": "0"}, {"w": "1"}]}
    return {"kind": "trials", "scheduler": "local_cwd", "plan": plan, "max_parallel": 1}


def test_a_status_that_overlaps_the_supervisors_last_write_never_undoes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`xrun cancel SWEEP` meanwhile: the supervisor records trial 0 (running) and trial 1
    (not started) CANCELLED and exits, between the status's read of state.json and its check
    of the supervisor's liveness. The status used to take the supervisor for dead *with the
    record it had read before*: it showed trial 1 "never started: the sweep supervisor is
    gone" and wrote that stale record over the supervisor's last one, for every later reader."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = records.create("local_cwd", "race-1", _spec())
    running = initial_state(2)
    running["trials"][0].update(state="RUNNING", app_id="race-0-app", started=1.0)
    save_state(path, running)
    records.write_json(os.path.join(path, records.SUPERVISOR_FILE), {"pid": 1, "start": 1})

    final = json.loads(json.dumps(running))
    final["trials"][0].update(state="CANCELLED", ended=2.0)
    final["trials"][1].update(state="CANCELLED", ended=2.0, msg="cancelled by request")
    final["msg"] = "cancelled by request"

    def supervisor_ends_now(self: trials.TrialsBackend, p: str) -> bool:
        save_state(p, final)  # its last write, then it exits: dead from here on
        return False

    monkeypatch.setattr(trials.TrialsBackend, "_supervisor_alive", supervisor_ends_now)
    st = trials.TrialsBackend(_Sched()).status("race-1")  # type: ignore[arg-type]
    assert st is not None
    assert [t.state for t in st.trials] == [AppState.CANCELLED, AppState.CANCELLED], st.trials
    assert st.trials[1].msg == "cancelled by request"
    on_disk = records.load_state(path, 2)
    assert on_disk is not None
    assert [t["state"] for t in on_disk["trials"]] == ["CANCELLED", "CANCELLED"]
    assert on_disk["msg"] == "cancelled by request"


def test_a_cancel_keeps_the_end_time_a_status_saw_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial 0's app ended on its own; a status saw it first (``ended/0``: its end time, what
    the table showed) before the supervisor's next round; then `xrun cancel SWEEP`. The
    supervisor's cancel recorded the trial with its own clock, so the duration moved."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = records.create("local_cwd", "race-2", _spec())
    state = initial_state(2)
    state["trials"][0].update(state="RUNNING", app_id="race-0-app", started=1.0)
    os.makedirs(os.path.join(path, records.ENDED_DIR))
    Path(path, records.ENDED_DIR, "0").write_text("100.0")  # the status's first_end

    class Sched(_Sched):
        def describe(self, app_id: str) -> DescribeAppResponse:
            return DescribeAppResponse(app_id, AppState.SUCCEEDED)

        def cancel(self, app_id: str) -> None:
            pass  # it had ended: nothing to stop

    cancel_everything(path, Sched(), state)  # type: ignore[arg-type]
    t = state["trials"][0]
    assert t["state"] == "SUCCEEDED" and t["ended"] == 100.0, t
