"""local_cwd's cancel signals an app's processes by their recorded (pid, start time): never a
later process that reuses such a pid. Real processes: a bystander blocks SIGTERM, so a signal
sent to it stays pending (``/proc/PID/status``: ShdPnd) and can be seen without a wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from xrun.procs import proc_start_time
from xrun.schedulers.local_cwd import procs

BLOCKING = (
    "import signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
    "print('ready', flush=True); sys.stdin.read()"
)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[str]]:
    """A live process that is none of the app's, SIGTERM blocked (it ends when stdin closes)."""
    p = subprocess.Popen(
        [sys.executable, "-c", BLOCKING], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        yield p
    finally:
        p.kill()
        p.wait(timeout=60)


def _sigterm_pending(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        shdpnd = next(line for line in f if line.startswith("ShdPnd:"))
    return bool(int(shdpnd.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_a_pid_reused_after_the_look_is_not_signalled(
    bystander: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's process (this pid, the recorded start) was alive when looked at, then ended,
    and the bystander took its pid before the signal went out. The look is forced to say
    alive, as it did before the reuse; the signal must still miss the bystander, whose start
    time is not the recorded one. (Checked, then sent by os.kill, it hit the bystander.)"""
    start = proc_start_time(bystander.pid)
    assert start is not None
    monkeypatch.setattr(procs, "is_alive", lambda pid, start: True)  # the look before the reuse
    procs._signal([(bystander.pid, start + 1)], signal.SIGTERM)
    assert not _sigterm_pending(bystander.pid)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_the_recorded_process_is_signalled_and_a_mismatch_is_not(
    bystander: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """With a pidfd and without one (another OS, a seccomp filter refusing the call)."""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    start = proc_start_time(bystander.pid)
    assert start is not None
    procs._signal([(bystander.pid, start + 1)], signal.SIGTERM)
    assert not _sigterm_pending(bystander.pid)
    procs._signal([(bystander.pid, start)], signal.SIGTERM)
    assert _sigterm_pending(bystander.pid)
