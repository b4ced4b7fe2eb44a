"""The sweep supervisor never stays forever for a trial whose app says UNKNOWN (its own
supervisor gone, its replicas leaving no exit record): past UNKNOWN_WAIT_S it stops waiting for
that trial, and the sweep's table still asks the trial's app (so nothing anyone reads changes)."""

from __future__ import annotations

import pytest

from xrun.schedulers.api import DescribeAppResponse
from xrun.specs import AppState
from xrun.sweeps import supervisor
from xrun.sweeps.supervisor import record, unsettled


def _running_trial() -> dict[str, object]:
    return {
        "state": "RUNNING",
        "app_id": "a-1",
        "exit_code": None,
        "host": "localhost",
        "started": 1.0,
        "ended": None,
        "msg": "",
    }


def test_an_unknown_trial_is_waited_for_then_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(supervisor.time, "time", lambda: now[0])
    t = _running_trial()
    unknown = DescribeAppResponse("a-1", AppState.UNKNOWN)
    assert record(t, unknown) is True and t["state"] == "UNKNOWN"
    assert unsettled(t)  # its app may still settle from its replicas' exit records
    now[0] += supervisor.UNKNOWN_WAIT_S - 1
    record(t, unknown)
    assert unsettled(t)
    now[0] += 2
    assert record(t, unknown) is True
    assert not unsettled(t) and t["ended"] is None  # given up; the table asks the app itself


def test_an_app_that_settles_in_time_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(supervisor.time, "time", lambda: now[0])
    t = _running_trial()
    record(t, DescribeAppResponse("a-1", AppState.UNKNOWN))
    now[0] += 10
    assert record(t, DescribeAppResponse("a-1", AppState.SUCCEEDED)) is True
    assert t["state"] == "SUCCEEDED" and t["ended"] == now[0] and "unknown_since" not in t
    assert not unsettled(t)
