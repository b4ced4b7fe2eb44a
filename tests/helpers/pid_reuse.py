"""A recorded pid reused by another process at a chosen moment, with real processes.

The kernel gives a pid to a new process only after the old one was reaped, at a moment no test
chooses. So the reuse is staged at the pid's three doors: the record names pid P, the
bystander's own; until :meth:`PidReuse.reuse` every look at P (``os.pidfd_open``, its start
time, ``os.kill``) reaches the recorded process, a real one with a pid of its own. ``reuse()``
kills and reaps it; from then on P is the bystander, as a reused pid would be. A pidfd opened
before the reuse pins the recorded process (now gone), as a real one would.

The bystander blocks SIGTERM and SIGUSR1, so a signal sent to it stays pending
(``/proc/PID/status``: ShdPnd) and is seen without a wait.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import xrun.procs

BLOCKING = (
    "import signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, "
    "signal.SIGUSR1}); print('ready', flush=True); sys.stdin.read()"
)


@contextmanager
def bystander() -> Iterator[subprocess.Popen[str]]:
    """A live process that is nobody's record, SIGTERM and SIGUSR1 blocked (it ends when
    its stdin closes, or is killed on the way out)."""
    p = subprocess.Popen(
        [sys.executable, "-c", BLOCKING], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        yield p
    finally:
        p.kill()
        p.wait(timeout=60)


def pending(pid: int, sig: int) -> bool:
    """Whether ``sig`` was sent to ``pid`` and waits there (blocked)."""
    with open(f"/proc/{pid}/status") as f:
        shdpnd = next(line for line in f if line.startswith("ShdPnd:"))
    return bool(int(shdpnd.split()[1], 16) & (1 << (sig - 1)))


class PidReuse:
    """Pid :attr:`pid` is the recorded process (start time :attr:`start`) until
    :meth:`reuse`, then the bystander's."""

    def __init__(self, recorded: subprocess.Popen[bytes], by: subprocess.Popen[str]) -> None:
        self.recorded, self.bystander = recorded, by
        self.pid = by.pid
        start = xrun.procs.proc_start_time(recorded.pid)
        assert start is not None and start != xrun.procs.proc_start_time(by.pid)
        self.start = start
        self.reused = False

    def real(self, pid: int) -> int:
        return self.recorded.pid if pid == self.pid and not self.reused else pid

    def reuse(self) -> None:
        """The recorded process ends and is reaped; its pid is the bystander's from now on."""
        if not self.reused:
            self.recorded.kill()
            self.recorded.wait(timeout=60)
            self.reused = True

    def install(self, monkeypatch: pytest.MonkeyPatch, after_look: bool = True) -> None:
        """Route the pid's doors; with ``after_look``, the reuse happens right after the first
        read of its start time (a check that has just passed)."""
        open_pidfd = getattr(os, "pidfd_open", None)
        start_time, kill = xrun.procs.proc_start_time, os.kill

        def look(pid: int) -> int | None:
            found = start_time(self.real(pid))
            if after_look and pid == self.pid:
                self.reuse()
            return found

        if open_pidfd is not None:
            monkeypatch.setattr(os, "pidfd_open", lambda pid, *a: open_pidfd(self.real(pid), *a))
        monkeypatch.setattr(os, "kill", lambda pid, sig: kill(self.real(pid), sig))
        monkeypatch.setattr(xrun.procs, "proc_start_time", look)


@contextmanager
def pid_reuse() -> Iterator[PidReuse]:
    """A :class:`PidReuse` over a fresh recorded process and bystander, both ended after."""
    with bystander() as by:
        recorded = subprocess.Popen(["sleep", "600"])
        r: PidReuse | None = None
        try:
            r = PidReuse(recorded, by)
            yield r
        finally:
            recorded.kill()
            recorded.wait(timeout=60)
            if r is not None:  # the doors lead where they say again: the bystander's end too
                r.reused = True
