"""Where each worker's output and error file go: torch's ``LogsSpecs`` contract.

``start_processes`` takes a ``logs_specs`` (torch 2.13's signature); its ``reify(envs)``
returns a ``LogsDest``: per local rank the file each stream is redirected to (``""``: the
console, ``os.devnull``: nowhere), the streams also copied to the console (``tee_*``, the
same file, tailed) and the error file. A custom class need only have ``reify`` and
``root_log_dir`` (torch's own ``LogsSpecs`` subclasses work too).

* ``DefaultLogsSpecs``: torch's layout, ``<log_dir>/<run_id>_<random>/attempt_<restart>/<r>/``;
  ``log_dir=os.devnull`` writes nothing and keeps the console (torchrun's ``--log-dir
  /dev/null``);
* ``RankDirLogsSpecs``: ``<log_dir>/<r>/``, what the agent uses under its own
  ``<log_dir>/<run_id>/attempt_<n>/`` and what ``start_processes(log_dir=...)`` means; without
  a log dir a tee'd stream goes to the console alone (``tee_* == ""``: a pipe, no file).

Standard library only (on the agent's start-up path); ``tempfile`` loads only when needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from xrun.errors import UsageError

from ..errors import ERROR_FILE_ENV
from .streams import Std, to_map

__all__ = ["DefaultLogsSpecs", "LogDirError", "LogsDest", "LogsSpecs", "RankDirLogsSpecs"]

_CONSOLE = ""  # a stream that is not redirected goes to the agent's console


class LogDirError(UsageError, NotADirectoryError):
    """The log dir is a file (torch raises NotADirectoryError; the CLI prints one line)."""


class LogsDest:
    """Per local rank: each stream's file (``""`` console, ``os.devnull`` nowhere), the tee'd
    streams (the same file, copied to the console), the error file, the filtered copies.
    torch's fields and order; a plain class, not a dataclass, because building a dataclass
    costs the agent's start-up a millisecond."""

    __slots__ = (
        "stdouts",
        "stderrs",
        "tee_stdouts",
        "tee_stderrs",
        "error_files",
        "filtered_stdout",
        "filtered_stderr",
    )

    def __init__(  # noqa: PLR0913 - torch's LogsDest fields
        self,
        stdouts: dict[int, str] | None = None,
        stderrs: dict[int, str] | None = None,
        tee_stdouts: dict[int, str] | None = None,
        tee_stderrs: dict[int, str] | None = None,
        error_files: dict[int, str] | None = None,
        filtered_stdout: str = "",
        filtered_stderr: str = "",
    ) -> None:
        self.stdouts = {} if stdouts is None else stdouts
        self.stderrs = {} if stderrs is None else stderrs
        self.tee_stdouts = {} if tee_stdouts is None else tee_stdouts
        self.tee_stderrs = {} if tee_stderrs is None else tee_stderrs
        self.error_files = {} if error_files is None else error_files
        self.filtered_stdout = filtered_stdout
        self.filtered_stderr = filtered_stderr


class LogsSpecs:
    """Base of the log layouts: where ``reify`` puts each rank's files (torch's ``LogsSpecs``)."""

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Std | Mapping[int, Std] = Std.NONE,
        tee: Std | Mapping[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        self._root_log_dir = log_dir
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = local_ranks_filter

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs: Mapping[int, MutableMapping[str, str]]) -> LogsDest:
        raise NotImplementedError

    def _fill(self, dest: LogsDest, nprocs: int, rank_dir_of: Mapping[int, str | None]) -> None:
        """Per rank: files under ``rank_dir_of[r]`` (None: no files), tee and console filter."""
        redirects = to_map(self._redirects, nprocs)
        tees = to_map(self._tee, nprocs)
        shown = self._local_ranks_filter
        for r in range(nprocs):
            rank_dir = rank_dir_of[r]
            to_file = redirects[r] | tees[r]  # tee = redirect to the file + tail it
            for bit, name, files, teed in (
                (Std.OUT, "stdout", dest.stdouts, dest.tee_stdouts),
                (Std.ERR, "stderr", dest.stderrs, dest.tee_stderrs),
            ):
                path = os.path.join(rank_dir, f"{name}.log") if rank_dir and to_file & bit else ""
                visible = not shown or r in shown
                if tees[r] & bit and visible and (path or rank_dir is None):
                    teed[r] = path  # "" here: no log dir, the console alone (a pipe)
                files[r] = path if path or visible else os.devnull


def _check_dir(log_dir: str) -> None:
    if os.path.isfile(log_dir):
        raise LogDirError(f"log_dir {log_dir!r} is a file: give a directory (or /dev/null)")


class DefaultLogsSpecs(LogsSpecs):
    """torch's default layout: ``<log_dir>/<run_id>_<random>/attempt_<restart>/<local_rank>/``
    with ``stdout.log``, ``stderr.log``, ``error.json``, plus ``filtered_std{out,err}.log``.
    No ``log_dir``: a fresh ``torchelastic_*`` temp dir; ``os.devnull``: no files at all."""

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Std | Mapping[int, Std] = Std.NONE,
        tee: Std | Mapping[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        if log_dir != os.devnull:
            if not log_dir:
                import tempfile  # benchmark 1: torch's LogsSpecs layout only, never the agent's

                log_dir = tempfile.mkdtemp(prefix="torchelastic_")
            _check_dir(log_dir)
            os.makedirs(log_dir, mode=0o700, exist_ok=True)
        super().__init__(log_dir, redirects, tee, local_ranks_filter)
        self._run_log_dir: str | None = None

    def reify(self, envs: Mapping[int, MutableMapping[str, str]]) -> LogsDest:
        nprocs = len(envs)
        env0 = envs[0] if nprocs else {}
        dest = LogsDest()
        if self._root_log_dir == os.devnull:
            self._fill(dest, nprocs, dict.fromkeys(range(nprocs)))
            for r in range(nprocs):
                dest.tee_stdouts.pop(r, None)
                dest.tee_stderrs.pop(r, None)
                dest.error_files[r] = os.devnull
                envs[r][ERROR_FILE_ENV] = ""
            return dest
        if self._run_log_dir is None:
            import tempfile  # benchmark 1: torch's LogsSpecs layout only, never the agent's

            run_id = env0.get("TORCHELASTIC_RUN_ID", "test_run_id")
            self._run_log_dir = tempfile.mkdtemp(prefix=f"{run_id}_", dir=self._root_log_dir)
        attempt = os.path.join(
            self._run_log_dir, f"attempt_{env0.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        )
        import shutil  # benchmark 1: torch's LogsSpecs layout only, never the agent's

        shutil.rmtree(attempt, ignore_errors=True)  # torch's: a restart reuses the number
        rank_dirs = {r: _make(os.path.join(attempt, str(r))) for r in range(nprocs)}
        self._fill(dest, nprocs, rank_dirs)
        for r in range(nprocs):
            dest.error_files[r] = envs[r][ERROR_FILE_ENV] = os.path.join(rank_dirs[r], "error.json")
        dest.filtered_stdout = os.path.join(attempt, "filtered_stdout.log")
        dest.filtered_stderr = os.path.join(attempt, "filtered_stderr.log")
        return dest


class RankDirLogsSpecs(LogsSpecs):
    """``<log_dir>/<local_rank>/{stdout.log,stderr.log,error.json}`` (dirs 0700), as the agent
    lays out each attempt; a worker's ``$TORCHELASTIC_ERROR_FILE`` in ``envs`` is kept."""

    def reify(self, envs: Mapping[int, MutableMapping[str, str]]) -> LogsDest:
        nprocs = len(envs)
        log_dir = self._root_log_dir
        if log_dir is None and any(
            r & ~t
            for r, t in zip(
                _values(self._redirects, nprocs), _values(self._tee, nprocs), strict=True
            )
        ):
            raise UsageError(
                "redirects need a log_dir to write <log_dir>/<local_rank>/stdout.log: "
                "pass log_dir or drop the redirects"
            )
        if log_dir is not None:
            _check_dir(log_dir)
            os.makedirs(log_dir, mode=0o700, exist_ok=True)
        rank_dirs = {
            r: None if log_dir is None else _make(os.path.join(log_dir, str(r)))
            for r in range(nprocs)
        }
        dest = LogsDest()
        self._fill(dest, nprocs, rank_dirs)
        for r in range(nprocs):
            rank_dir = rank_dirs[r]
            own = envs[r].get(ERROR_FILE_ENV)
            path = own or (os.path.join(rank_dir, "error.json") if rank_dir else "")
            dest.error_files[r] = path
            if path:
                envs[r][ERROR_FILE_ENV] = path
        if log_dir is not None:
            dest.filtered_stdout = os.path.join(log_dir, "filtered_stdout.log")
            dest.filtered_stderr = os.path.join(log_dir, "filtered_stderr.log")
        return dest


def _values(v: Std | Mapping[int, Std], n: int) -> list[Std]:
    return list(to_map(v, n).values())


def _make(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)  # logs and tracebacks are for the user alone
    return path
