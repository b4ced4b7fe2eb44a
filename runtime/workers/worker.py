"""``Worker``: one started worker process, as the launcher made it and ``PContext`` watches it.

The handle the two halves of ``start_processes`` share (``launch.py`` creates them, ``api.py``
waits on them), so that neither imports the other.
"""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = ["Worker"]


class Worker:
    """One started worker: its pid, the fd that tells its exit, how to reap it."""

    def __init__(
        self,
        local_rank: int,
        pid: int,
        handle: Any,
        error_file: str | None,
        wait_fd: int | None,
        owns_fd: bool,
    ) -> None:
        self.local_rank = local_rank
        self.pid = pid
        self.handle = handle  # subprocess.Popen or multiprocessing.Process
        self.error_file = error_file
        self.exitcode: int | None = None
        self.exit_time = 0.0
        # When a look last found it running (0: never): it died after that, at or before
        # exit_time (errors/report.root_cause orders failures seen in one look by this).
        self.seen_alive = 0.0
        # The signals the agent sent while the worker still ran, in order: a death by one of
        # them is the agent's own stop, not a kill from outside (errors/deaths.py).
        self.sent: list[int] = []
        self._wait_fd = wait_fd
        self._owns_fd = owns_fd

    @property
    def fd(self) -> int | None:
        return self._wait_fd

    def poll(self) -> int | None:
        """Reap without blocking; the exit code once the process is gone."""
        if self.exitcode is None:
            now = time.time()
            code = self.handle.poll() if hasattr(self.handle, "poll") else self.handle.exitcode
            if code is not None:
                self.exitcode = code
                self.exit_time = now
                self.close_fd()
            else:
                self.seen_alive = now
        return self.exitcode

    def close_fd(self) -> None:
        if self._wait_fd is not None and self._owns_fd:
            os.close(self._wait_fd)
        self._wait_fd = None

    def killpg(self, sig: int) -> None:
        """``sig`` to the worker's process group; to the pid alone if the group is not made
        yet (a function worker makes its own session as its first act)."""
        # Reaped first: a worker that died of an outside signal a moment ago is not one the
        # agent's signal reached.
        if self.poll() is None and sig not in self.sent:
            self.sent.append(sig)
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            if self.exitcode is None:
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
        except PermissionError:  # the pid is reused by a process group not ours
            pass
