"""Races between a reader of a local_cwd app (``status``) and its supervisor's last write,
forced at the racy point (a reader on a busy machine can be descheduled there for any time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xrun.schedulers.local_cwd import LocalCwdScheduler, statedir
from xrun.schedulers.local_cwd import scheduler as scheduler_mod
from xrun.schedulers.local_cwd import status as status_mod
from xrun.schedulers.local_cwd.supervisor import write_json_atomic
from xrun.specs import AppDef, AppState, Role


def _state(state: str, rep_state: str, code: int | None, msg: str = "") -> dict[str, Any]:
    return {
        "app_id": "x",
        "state": state,
        "msg": msg,
        "supervisor": {"pid": 4242, "start": 1},
        "started_at": 1.0,
        "ended_at": None if state == "RUNNING" else 2.0,
        "replicas": [
            {"role": "w", "id": 0, "pid": 4243, "start": 1, "exit_code": code,
             "state": rep_state, "msg": ""},
        ],
    }  # fmt: skip


def _app_paths(sched: LocalCwdScheduler, tmp_path: Path) -> tuple[str, statedir.AppPaths]:
    """A registered app whose replica runs no runtime agent (so it leaves no exit record)."""
    app = AppDef("t", [Role("w", image="", entrypoint="sh", args=["-c", "exit 3"])])
    req = sched.submit_dryrun(app, {"log_dir": str(tmp_path / "logs")}).request
    paths = statedir.AppPaths(req.app_dir)
    statedir.make_private_dirs(paths.state_dir)
    Path(paths.request).write_text(json.dumps(req.to_json()))
    statedir.register(req.app_id, req.app_dir)
    write_json_atomic(paths.state, _state("RUNNING", "RUNNING", None))
    return req.app_id, paths


def test_status_as_the_supervisor_writes_its_last_record_and_exits(
    sched: LocalCwdScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replica (no runtime agent: no exit record) failed; its supervisor recorded the app
    FAILED and exited between the status's read of state.json (RUNNING) and its liveness check
    of the supervisor. The status used to take the supervisor for one that died before the app
    ended, and the app for UNKNOWN ("ended without an exit record"), from the stale record."""
    app_id, paths = _app_paths(sched, tmp_path)
    final = _state("FAILED", "FAILED", 3, msg="replica w/0 exited with code 3")

    def is_alive(pid: int | None, start: int | None) -> bool:
        if pid == 4242:  # the supervisor: its last write, then it exits
            write_json_atomic(paths.state, final)
        return False

    monkeypatch.setattr(status_mod, "is_alive", is_alive)
    resp = sched.describe(app_id)
    assert resp is not None
    assert resp.state == AppState.FAILED, resp
    assert resp.msg == "replica w/0 exited with code 3"
    (rep,) = resp.roles_statuses[0].replicas
    assert rep.state == AppState.FAILED and rep.exit_code == 3


def test_cancel_as_the_supervisor_writes_its_last_record_and_exits(
    sched: LocalCwdScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow supervisor (a busy machine) outlived cancel's wait for it; then, between cancel's
    last read of state.json (RUNNING) and its liveness check, it recorded the app FAILED (its
    replica's own failure) and exited. Cancel used to take it for dead with the stale record
    and write CANCELLED "after the supervisor died" over the supervisor's last word."""
    app_id, paths = _app_paths(sched, tmp_path)
    final = _state("FAILED", "FAILED", 3, msg="replica w/0 exited with code 3")
    writes = [_state("RUNNING", "RUNNING", None)]  # what the supervisor has on disk so far

    def is_alive(pid: int | None, start: int | None) -> bool:
        if pid != 4242:
            return False
        if writes:  # cancel's first look (signal_if_same's): alive
            writes.pop()
            return True
        write_json_atomic(paths.state, final)  # the later look: its last write, then exit
        return False

    def signal_if_same(pid: int | None, start: int | None, sig: int) -> bool:
        return is_alive(pid, start)  # sent (pid 4242 is no process of ours: nothing is)

    monkeypatch.setattr(status_mod, "is_alive", is_alive)
    monkeypatch.setattr(scheduler_mod, "is_alive", is_alive)
    monkeypatch.setattr(scheduler_mod, "signal_if_same", signal_if_same)
    monkeypatch.setattr(sched, "wait", lambda app_id, timeout=None: None)  # timed out
    monkeypatch.setattr(status_mod, "live_groups", lambda st: [])
    sched.cancel(app_id)
    st = statedir.read_state(paths.state)
    assert st is not None and st["state"] == "FAILED", st
    assert st["msg"] == "replica w/0 exited with code 3"
