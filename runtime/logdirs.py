"""The agent's log layout: ``<log_dir>/<run_id>/attempt_<n>/`` (each worker writes its
``<local_rank>/{stdout.log,stderr.log,error.json}`` under the attempt's directory)."""

from __future__ import annotations

import os

from xrun.errors import UsageError
from xrun.limits import shown

__all__ = ["AttemptDirs"]


class AttemptDirs:
    """One directory per start of the worker group: ``n`` counts every start, membership
    restarts included, so no attempt overwrites another's logs.

    Without a ``log_dir`` the base is a fresh temp dir, which ``remove_temp`` deletes when the
    agent is done with it (kept after a worker failure: the report names files in it). Every directory created here is 0700:
    logs and tracebacks are the user's alone (a log dir that exists already keeps the mode its
    owner gave it).
    """

    def __init__(self, log_dir: str | None, run_id: str) -> None:
        self._log_dir = log_dir
        self._run_id = run_id or "none"
        self._run_dir = ""
        self._attempt = 0  # worker group starts so far
        self._temp = ""  # the temp dir this agent made, if it made one

    def prepare(self) -> None:
        """Create the run's directory now (the agent calls it before the rendezvous): a log dir
        the agent cannot use is a usage error before any peer waits for this node."""
        if not self._run_dir:
            self._run_dir = self._make_run_dir()

    def next(self, nproc: int = 0) -> str:
        """Create and return the next attempt's directory, with one subdirectory per local
        rank ``0..nproc-1`` (the workers write their error.json there, redirected or not)."""
        self.prepare()
        path = os.path.join(self._run_dir, f"attempt_{self._attempt}")
        self._mkdirs(path)
        for lr in range(nproc):
            self._mkdirs(os.path.join(path, str(lr)))
        self._attempt += 1
        return path

    def _mkdirs(self, path: str) -> None:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except FileExistsError as e:  # a file where a directory belongs
            e.strerror = "a file is in the way (not a directory)"
            raise self._unusable(path, e) from None
        except OSError as e:
            raise self._unusable(path, e) from None

    def _unusable(self, path: str, e: OSError) -> UsageError:
        flag = f"--log-dir {shown(self._log_dir, 200)}" if self._log_dir else "the temp dir"
        return UsageError(
            f"{flag} cannot hold the agent's logs: {path}: {e.strerror or e}; give a "
            "directory the agent can create and write (or --log-dir /dev/null for no logs)"
        )

    def _make_run_dir(self) -> str:
        if self._log_dir:
            base = self._log_dir
        else:
            import tempfile  # benchmark 1: only without a log dir (tempfile pulls random, hashlib)

            try:
                base = self._temp = tempfile.mkdtemp(prefix="xrun_")
            except OSError as e:
                raise self._unusable(tempfile.gettempdir(), e) from None
        self._mkdirs(base)
        # Several agents of one job may share a host and a log dir: the first one gets
        # <run_id>, the others <run_id>.1, .2 ... (os.mkdir is atomic, so no two collide).
        for i in range(1000):
            path = os.path.join(base, self._run_id if i == 0 else f"{self._run_id}.{i}")
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                continue
            except OSError as e:
                raise self._unusable(path, e) from None
        return path

    @property
    def run_dir(self) -> str:
        """``<log_dir>/<run_id>`` once prepared ("" before)."""
        return self._run_dir

    @property
    def temp(self) -> str:
        """The temp dir this agent made ("" when none)."""
        return self._temp

    def remove_temp(self) -> None:
        """Delete the temp dir this agent made (nothing when the user gave a log dir): a day
        of jobs would otherwise leave hundreds of ``xrun_*`` dirs in ``$TMPDIR``."""
        if self._temp:
            import shutil  # benchmark 1: only to remove the temp dir; shutil pulls bz2 and lzma

            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = ""
