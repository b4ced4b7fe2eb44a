"""The agent's side of a graceful stop (the workers' side: :mod:`xrun.runtime.stop`).

A stop signal (SIGTERM: a preemption, ``docker stop``, ``xrun cancel``, SIGTERM to a supervisor;
SIGUSR1/SIGUSR2: Slurm's ``--signal`` warning) is, for workers that watch for stop requests
(they call ``xrun.runtime.stop.requested``), not forwarded to them: the agent

* creates the flag file ``$XRUN_STOP_DIR/stop`` that its workers look for at each step,
* tells the other nodes' agents through the rendezvous store (the round's ``stale`` key, which
  every agent already watches, with a reason that starts with :data:`STOP_MARK`), so that every
  rank on every node sees the request within a second, whichever agent got the signal,
* notes the request in ``$XRUN_STOP_RECORD`` when set (the Slurm batch script reads it to
  requeue the job once),
* waits for its workers to end on their own for the whole grace (``$XRUN_STOP_GRACE`` seconds:
  the partition's GraceTime or the warning's lead time, set by the Slurm batch script; else
  ``--shutdown-timeout``), each rank as long as it needs inside it, and only then stops the
  rest (SIGTERM, ``--shutdown-timeout``, SIGKILL).

Workers that do not watch get the signal at once, as before (torchrun's behaviour).
Standard library only (the agent's start-up path).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import TYPE_CHECKING

from xrun.contract import STOP_DIR_ENV, STOP_GRACE_ENV, STOP_RECORD_ENV

from .stop import FLAG

if TYPE_CHECKING:
    from .workers.api import PContext

__all__ = ["STOP_MARK", "StopControl", "stop_signal_of"]

STOP_MARK = "xrun-stop:"  # a stale-round reason that is a stop request, not a restart
# SIGINT (Ctrl-C), SIGHUP and SIGQUIT keep their immediate meaning.
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2})


def stop_signal_of(reason: str) -> int:
    """The signal number of a peer's stop request in a stale-round ``reason``; 0 if none."""
    i = reason.find(STOP_MARK)
    if i < 0:
        return 0
    name = reason[i + len(STOP_MARK) :].split()[0] if reason[i + len(STOP_MARK) :].split() else ""
    try:
        return int(signal.Signals[name])
    except KeyError:
        return int(signal.SIGTERM)


class StopControl:
    """One agent's stop requests: the workers' flag dir, the grace, the record."""

    def __init__(self, run_id: str, shutdown_timeout: float) -> None:
        base = os.environ.get("TMPDIR") or "/tmp"
        self.dir = os.path.join(base, f"xrun-stop-{os.getpid()}-{run_id[:40]}")
        self.shutdown_timeout = shutdown_timeout
        self.requested = 0  # the signal of the request (0: none)

    @staticmethod
    def handles(signum: int) -> bool:
        return signum in _STOP_SIGNALS

    def prepare(self) -> dict[str, str]:
        """Before each start of the workers: an empty flag dir; their env."""
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            self._clear()
        except OSError:
            return {}
        return {STOP_DIR_ENV: self.dir}

    def watched(self) -> bool:
        """Does any local worker watch for stop requests?"""
        try:
            return any(n.startswith("watch-") for n in os.listdir(self.dir))
        except OSError:
            return False

    def request(self, signum: int, origin: str) -> None:
        """Raise the flag for the local workers and note the request (once)."""
        if self.requested:
            return
        self.requested = signum
        try:
            os.close(os.open(os.path.join(self.dir, FLAG), os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError:
            pass
        record = os.environ.get(STOP_RECORD_ENV)
        if record:
            line = f"{int(time.time())} {signal.Signals(signum).name} {socket.gethostname()} {origin}\n"
            try:
                with open(record, "a") as f:
                    f.write(line)
            except OSError:
                pass

    def grace(self) -> float:
        raw = os.environ.get(STOP_GRACE_ENV, "")
        try:
            value = float(raw)
        except ValueError:
            return self.shutdown_timeout
        return value if value > 0 else self.shutdown_timeout

    def wait(self, pc: PContext, grace: float) -> int:
        """Let the workers end on their own for ``grace`` s, then stop the rest; how many
        had to be stopped."""
        deadline = time.monotonic() + grace
        running = pc._reap()  # noqa: SLF001 - the context's own reaping, without a signal
        while running and time.monotonic() < deadline:
            pc._sleep(min(1.0, deadline - time.monotonic()))  # noqa: SLF001
            running = pc._reap()  # noqa: SLF001
        pc.close(signal.SIGTERM, self.shutdown_timeout)
        return running

    def _clear(self) -> None:
        try:
            for name in os.listdir(self.dir):
                os.remove(os.path.join(self.dir, name))
        except OSError:
            pass

    def remove(self) -> None:
        self._clear()
        try:
            os.rmdir(self.dir)
        except OSError:
            pass
