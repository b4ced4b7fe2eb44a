"""local_cwd's cancel signals an app's processes by their recorded (pid, start time): never a
later process that reuses such a pid. Real processes; the reuse is staged at the pid's doors
(see :mod:`tests.helpers.pid_reuse`), at the one moment that tells the orders apart: right
after the start-time check has passed, before the signal goes out."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest

from tests.helpers.pid_reuse import bystander, pending, pid_reuse
from xrun.procs import proc_start_time
from xrun.schedulers.local_cwd import LocalCwdScheduler, procs, statedir
from xrun.schedulers.local_cwd.supervisor import write_json_atomic
from xrun.specs import AppDef, Role


def test_a_pid_reused_after_the_check_is_not_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's process passed the start-time check, then ended, and the bystander took its
    pid before the signal went out. Sent through the pidfd opened before the check, the signal
    goes to the process checked (gone: ESRCH), not the bystander. (Checked then sent by
    os.kill, or checked then a pidfd opened, it hit the bystander.)"""
    with pid_reuse() as r:
        r.install(monkeypatch)
        procs._signal([(r.pid, r.start)], signal.SIGTERM)
        assert r.reused  # the staged reuse happened, between the check and the send
        assert not pending(r.pid, signal.SIGTERM)


def test_without_a_pidfd_the_same_reuse_is_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no pidfd, check-then-kill is all there is, and the staged reuse above
    does reach the bystander: the window the pidfd closes is real."""
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    with pid_reuse() as r:
        r.install(monkeypatch)
        procs._signal([(r.pid, r.start)], signal.SIGTERM)
        assert r.reused
        assert pending(r.pid, signal.SIGTERM)


def signals_only_the_recorded_process() -> None:
    """A live process recorded with another start time is not signalled; recorded with its own,
    it is."""
    with bystander() as p:
        start = proc_start_time(p.pid)
        assert start is not None
        procs._signal([(p.pid, start + 1)], signal.SIGTERM)
        assert not pending(p.pid, signal.SIGTERM)
        procs._signal([(p.pid, start)], signal.SIGTERM)
        assert pending(p.pid, signal.SIGTERM)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_the_recorded_process_is_signalled_and_a_mismatch_is_not(
    monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """With a pidfd and without one (another OS, a seccomp filter refusing the call)."""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    signals_only_the_recorded_process()


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EPERM], ids=["ENOSYS", "EPERM"])
def test_a_refused_pidfd_send_signal_falls_back_on_the_pid(
    monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    """A seccomp filter (a container's) may allow pidfd_open and refuse pidfd_send_signal:
    the signal still goes out, checked then by the pid, as where there is no pidfd at all.
    (It raised OSError(ENOSYS) out of cancel, and EPERM left the process unsignalled.)"""

    def refused(fd: int, sig: int, *a: object) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(signal, "pidfd_send_signal", refused)
    signals_only_the_recorded_process()


def test_cancel_never_signals_a_process_that_took_the_supervisors_pid(
    sched: LocalCwdScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's supervisor passed cancel's start-time check, then died, and the bystander
    took its pid before the SIGTERM went out. Cancel opened a pidfd for that check, closed it
    and sent by os.kill: to the bystander. It must stop the orphaned app itself instead."""
    app = AppDef("t", [Role("w", image="", entrypoint="true")])
    req = sched.submit_dryrun(app, {"log_dir": str(tmp_path / "logs")}).request
    paths = statedir.AppPaths(req.app_dir)
    statedir.make_private_dirs(paths.state_dir)
    Path(paths.request).write_text(json.dumps(req.to_json()))
    statedir.register(req.app_id, req.app_dir)
    with pid_reuse() as r:
        replica = {"role": "w", "id": 0, "pid": None, "start": None, "exit_code": None,
                   "state": "RUNNING", "msg": ""}  # fmt: skip
        state = {"app_id": req.app_id, "state": "RUNNING", "msg": "", "started_at": 1.0,
                 "ended_at": None, "supervisor": {"pid": r.pid, "start": r.start},
                 "replicas": [replica]}  # fmt: skip
        write_json_atomic(paths.state, state)
        r.install(monkeypatch)
        sched.cancel(req.app_id)
        assert r.reused  # the staged reuse happened, right after the check
        assert not pending(r.pid, signal.SIGTERM)
    st = statedir.read_state(paths.state)
    assert st is not None and st["state"] == "CANCELLED", st
