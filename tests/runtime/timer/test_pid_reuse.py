"""The file timer never signals a process that took the pid of a worker it was told about
(a worker of an attempt that ended: its timers outlive it while the agent waits for the next
round). Real processes; the reuse is staged by tests/helpers/pid_reuse.py."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.pid_reuse import pending, pid_reuse
from tests.helpers.waiting import wait_for
from xrun.runtime.timer.server import FileTimerServer


def test_an_expired_timer_does_not_signal_a_reused_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = FileTimerServer(str(tmp_path / "watchdog_timer"))
    try:
        with pid_reuse() as r:
            r.install(monkeypatch, after_look=False)
            server.watch({0: r.pid})  # the attempt's worker, alive
            req = {"version": 1, "pid": r.pid, "scope_id": "step", "signal": signal.SIGTERM}
            with open(server.path, "w") as f:
                f.write(json.dumps({**req, "expiration_time": time.time() + 1.0}) + "\n")
            wait_for(lambda: server.requests == 1, timeout=30, what="the request")
            r.reuse()  # the worker died and was reaped; an unrelated process took its pid
            wait_for(lambda: not server._timers, timeout=30, what="the timer to expire")
            assert not pending(r.pid, signal.SIGTERM), "the reused pid's process was signalled"
            assert server.expired(r.pid) is None
    finally:
        server.stop()


def test_a_dead_workers_timer_does_not_signal_the_next_worker_with_its_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next attempt's worker took the dead worker's pid: the agent's watch() names that pid
    again, and the old worker's timer (never released) must not fire at the new worker."""
    server = FileTimerServer(str(tmp_path / "watchdog_timer"))
    try:
        with pid_reuse() as r:
            r.install(monkeypatch, after_look=False)
            server.watch({0: r.pid})  # attempt 0's worker, alive
            req = {"version": 1, "pid": r.pid, "scope_id": "step", "signal": signal.SIGTERM}
            with open(server.path, "w") as f:
                f.write(json.dumps({**req, "expiration_time": time.time() + 2.0}) + "\n")
            wait_for(lambda: server.requests == 1, timeout=30, what="the request")
            r.reuse()  # the worker died; attempt 1's worker got its pid
            server.watch({0: r.pid})  # attempt 1 started
            wait_for(lambda: not server._timers, timeout=30, what="the timer to expire")
            assert not pending(r.pid, signal.SIGTERM), "the next attempt's worker was signalled"
            assert server.expired(r.pid) is None
    finally:
        server.stop()
