"""A sweep's cancel signals its supervisor by the recorded (pid, start time): never a later
process that took the pid. The reuse is staged right after the start-time check has passed
(see :mod:`tests.helpers.pid_reuse`); the scheduler is a fake (its calls are not the point)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.pid_reuse import pending, pid_reuse
from xrun.schedulers.api import DescribeAppResponse
from xrun.specs import AppState
from xrun.sweeps import records, trials
from xrun.sweeps.supervisor import initial_state, save_state


class _Sched:
    """A trial's app: stops when told to, then reads CANCELLED."""

    backend = "local_cwd"
    session_name = "test"

    def cancel(self, app_id: str) -> None:
        pass

    def describe(self, app_id: str) -> DescribeAppResponse:
        return DescribeAppResponse(app_id, AppState.CANCELLED)


def _sweep(sweep_id: str, sup: dict[str, Any]) -> str:
    plan = {"name": "reuse", "params": ["w"], "trials": [{"w": "0"}, {"w": "1"}]}
    spec = {"kind": "trials", "scheduler": "local_cwd", "plan": plan, "max_parallel": 1}
    path = records.create("local_cwd", sweep_id, spec)
    state = initial_state(2)
    state["trials"][0].update(state="RUNNING", app_id="reuse-0-app", started=1.0)
    save_state(path, state)
    records.write_json(os.path.join(path, records.SUPERVISOR_FILE), sup)
    return path


@pytest.mark.parametrize("trial", [None, 0], ids=["sweep", "trial"])
def test_cancel_never_signals_a_process_that_took_the_supervisors_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trial: int | None
) -> None:
    """The supervisor passed the check, then died, and the bystander took its pid before
    the signal (SIGTERM: stop every trial; SIGUSR1: read the cancel requests) went out by
    os.kill. The cancel must reach the trials itself, and leave the bystander alone."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with pid_reuse() as r:
        path = _sweep(f"reuse-{trial}", {"pid": r.pid, "start": r.start})
        r.install(monkeypatch)
        trials.TrialsBackend(_Sched()).cancel(f"reuse-{trial}", trial)  # type: ignore[arg-type]
        assert r.reused  # the staged reuse happened, right after the check
        assert not pending(r.pid, signal.SIGTERM) and not pending(r.pid, signal.SIGUSR1)
    state = records.load_state(path, 2)
    assert state is not None and state["trials"][0]["state"] == "CANCELLED", state
