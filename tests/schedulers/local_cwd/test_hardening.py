"""Issue #17 on local_cwd: ``status`` and ``cancel`` never lie, a full disk is reported, an
app whose state dir was deleted can still be stopped. Real processes throughout; the one mock
is a process that SIGKILL cannot end (a real system cannot make one on demand)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.box import tmpfs
from tests.helpers.waiting import wait_for
from xrun.errors import SchedulerError
from xrun.procs import is_alive
from xrun.schedulers.local_cwd import LocalCwdScheduler, procs, statedir
from xrun.specs import AppDef, AppState, Role


def _app(entrypoint: str, *args: str, n: int = 1) -> AppDef:
    return AppDef(
        "t", [Role("w", image="", entrypoint=entrypoint, args=list(args), num_replicas=n)]
    )


def _sh(script: str, n: int = 1) -> AppDef:
    return _app("sh", "-c", script, n=n)


def _agent(script: str) -> AppDef:
    """One replica running xrun's runtime agent (which writes the replica's exit record)."""
    return _app(
        sys.executable,
        "-m",
        "xrun.runtime",
        "--standalone",
        "--nproc-per-node",
        "1",
        "--no-python",
        "sh",
        "-c",
        script,
    )


def _state(sched: LocalCwdScheduler, app_id: str) -> dict:  # type: ignore[type-arg]
    paths = statedir.find(app_id)
    assert paths is not None
    st = statedir.read_json(paths.state)
    assert st is not None
    return st


def _running(sched: LocalCwdScheduler, app_id: str) -> dict:  # type: ignore[type-arg]
    wait_for(lambda: all(r["state"] == "RUNNING" for r in _state(sched, app_id)["replicas"]))
    return _state(sched, app_id)


def _kill_supervisor(sched: LocalCwdScheduler, app_id: str) -> None:
    sup = _running(sched, app_id)["supervisor"]
    os.kill(sup["pid"], signal.SIGKILL)
    wait_for(lambda: not is_alive(sup["pid"], sup["start"]))


# --------------------------------------------------------------------------- status
@pytest.mark.parametrize(
    "app, final",
    [
        (_agent("sleep 1.5; exit 0"), AppState.SUCCEEDED),
        (_agent("sleep 1.5; exit 3"), AppState.FAILED),
        (_sh("sleep 1.5"), AppState.UNKNOWN),  # no runtime agent: no exit record
    ],
    ids=["succeeded", "failed", "no-record"],
)
def test_status_after_a_killed_supervisor_is_the_replicas_own_record(
    sched: LocalCwdScheduler, tmp_path: Path, app: AppDef, final: AppState
) -> None:
    app_id = sched.submit(app, {"log_dir": str(tmp_path / "logs")})
    _kill_supervisor(sched, app_id)
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.UNKNOWN and "still run" in resp.msg
    wait_for(
        lambda: not any(is_alive(r["pid"], r["start"]) for r in _state(sched, app_id)["replicas"])
    )
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == final, resp
    assert "supervisor" in resp.msg
    (rep,) = resp.roles_statuses[0].replicas
    if final == AppState.UNKNOWN:
        assert rep.state == AppState.UNKNOWN and "without an exit record" in resp.msg
    else:
        assert rep.exit_code == (0 if final == AppState.SUCCEEDED else 1)  # the agent: 1
        assert rep.state == final


def test_the_agent_writes_its_exit_record_only_where_told(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    app_id = sched.submit(_agent("exit 4"), {"log_dir": str(tmp_path / "logs")})
    resp = sched.wait(app_id, timeout=60)
    assert resp is not None and resp.state == AppState.FAILED
    paths = statedir.find(app_id)
    assert paths is not None
    record = json.loads(Path(paths.exit_record("w", 0)).read_text())
    assert record["exitcode"] == 1  # the agent exits 1 when a worker fails
    # the workers never see the variable (a nested agent would overwrite the record)
    app_id = sched.submit(
        _agent('test -z "$XRUN_EXIT_RECORD" && test -n "$XRUN_APP_DIR"'),
        {"log_dir": str(tmp_path / "logs")},
    )
    resp = sched.wait(app_id, timeout=60)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp


# --------------------------------------------------------------------------- cancel
def test_cancel_after_the_supervisor_died_sees_every_process_end(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    """The issue's lie: a worker that ignores SIGTERM, its supervisor gone, and cancel said
    "cancelled". Now it returns only once every process of the app has ended."""
    app_id = sched.submit(
        _sh("trap '' TERM; sleep 60 & sleep 61; wait", n=2),
        {"log_dir": str(tmp_path / "logs"), "stop_grace_s": 1},
    )
    paths = statedir.find(app_id)
    assert paths is not None
    _kill_supervisor(sched, app_id)
    mine = procs.app_processes(app_dir=paths.app_dir)
    assert len(mine) >= 4  # two shells, each with two sleeps
    sched.cancel(app_id)
    assert [p for p in mine if is_alive(*p)] == []
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.CANCELLED


def test_cancel_says_so_when_a_process_will_not_end(
    sched: LocalCwdScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process SIGKILL cannot end (uninterruptible sleep) cannot be made on demand: the stop
    is made to report one, and cancel must not claim success."""
    app_id = sched.submit(_sh("sleep 60"), {"log_dir": str(tmp_path / "logs"), "stop_grace_s": 1})
    _running(sched, app_id)
    real_stop = procs.stop
    monkeypatch.setattr(procs, "stop", lambda found, grace: real_stop(found, grace) or [(4242, 1)])
    monkeypatch.setattr(procs, "app_processes", lambda **kw: {(4242, 1): "x"})
    with pytest.raises(SchedulerError, match="could not stop process"):
        sched.cancel(app_id)


def test_a_supervisor_that_fails_records_failed_with_the_cause(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    """An env var name the checks would refuse, forced into the request: the supervisor fails
    in Popen. The app is FAILED with that cause (not SUBMITTED for ever), nothing is left
    running, and schedule() says why on one line."""
    info = sched.submit_dryrun(_sh("sleep 60", n=2), {"log_dir": str(tmp_path / "logs")})
    info.request.replicas[1].env["BAD=NAME"] = "v"
    with pytest.raises(SchedulerError) as e:
        sched.schedule(info)
    assert "\n" not in str(e.value) and "environment variable" in str(e.value)
    app_id = info.request.app_id
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.FAILED
    assert "the supervisor failed" in resp.msg and "environment variable" in resp.msg
    st = _state(sched, app_id)
    assert not any(is_alive(r["pid"], r["start"]) for r in st["replicas"])


def test_an_app_whose_supervisor_never_started_is_failed(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    """The launcher was killed between writing the request and starting the supervisor."""
    req = sched.submit_dryrun(_sh("true"), {"log_dir": str(tmp_path / "logs")}).request
    paths = statedir.AppPaths(req.app_dir)
    os.makedirs(paths.state_dir)
    Path(paths.request).write_text(json.dumps(req.to_json()))
    statedir.register(req.app_id, req.app_dir)
    assert sched.describe(req.app_id).state == AppState.SUBMITTED  # type: ignore[union-attr]
    old = time.time() - 120
    os.utime(paths.request, (old, old))
    resp = sched.describe(req.app_id)
    assert resp is not None and resp.state == AppState.FAILED and "never started" in resp.msg


# --------------------------------------------------------------------------- the disk
def test_a_full_disk_is_reported_and_leaves_no_temp_file(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "small", size="1m") as logs:
        app_id = sched.submit(
            _sh('dd if=/dev/zero of="$XRUN_APP_DIR/fill" bs=64k 2>/dev/null; sleep 0.3'),
            {"log_dir": str(logs)},
        )
        resp = sched.wait(app_id, timeout=60)
        assert resp is not None and resp.state == AppState.SUCCEEDED
        assert "No space left on device" in resp.msg
        paths = statedir.find(app_id)
        assert paths is not None
        assert "No space left on device" in Path(paths.supervisor_log).read_text()
        assert [f for f in os.listdir(paths.state_dir) if f.endswith(".tmp")] == []


# --------------------------------------------------------------------------- a deleted state dir
def test_an_app_whose_state_dir_was_deleted_can_still_be_stopped(
    sched: LocalCwdScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    app_id = sched.submit(_sh("trap '' TERM; sleep 60"), {"stop_grace_s": 1})
    st = _running(sched, app_id)
    import shutil

    shutil.rmtree(tmp_path / "state")
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.UNKNOWN
    assert "files are gone" in resp.msg and "xrun cancel" in resp.msg
    sched.cancel(app_id)
    assert not any(is_alive(r["pid"], r["start"]) for r in st["replicas"])
    assert procs.app_processes(app_id=app_id) == {}
    assert sched.describe(app_id) is None
