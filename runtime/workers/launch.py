"""The starting half of ``start_processes``: log files, pipes and the fork of each worker.

Kept apart from ``api.py`` (the watching half) so that each stays small; ``worker.py`` holds
the handle both use. ``subprocess`` is imported for binaries only,
``multiprocessing``/``pickle``/``tempfile`` for functions only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from xrun.contract import AGENT_ONLY_ENV
from xrun.errors import UsageError

from ..errors import ERROR_FILE_ENV
from .child import InheritFd, function_main, make_preexec
from .streams import Std
from .tee import Tee, make_pipe
from .worker import Worker

_STREAMS = ((Std.OUT, 1, "stdout"), (Std.ERR, 2, "stderr"))


class _RankOutput(NamedTuple):
    """Where one local rank's output goes: what to redirect or tee, the console prefix and its
    log directory (None without a log_dir). A NamedTuple: cheaper to create at import than a
    dataclass, on every agent's start-up path."""

    rank: int
    redirect: Std
    tee: Std
    prefix: str
    rank_dir: str | None


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``: readable once the process exits. None before Linux 5.3."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _open_log(path: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
    return fd


class Launcher:
    """Starts the workers of one ``start_processes`` call, one ``start`` per local rank."""

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        start_method: str,
        log_dir: str | None,
        local_ranks_filter: set[int] | None,
    ) -> None:
        self.name = name
        self.entrypoint = entrypoint
        self.start_method = start_method
        self.log_dir = log_dir
        self.ranks_filter = local_ranks_filter
        self.parent_pid = os.getpid()
        self.workers: list[Worker] = []
        self.stdouts: dict[int, str] = {}
        self.stderrs: dict[int, str] = {}
        self.tee = Tee(f"{name}-tee")
        self.result_dir: str | None = None
        self._mp: Any = None
        self._preexec: Callable[[], None] | None = None
        if isinstance(entrypoint, str):
            self._preexec = make_preexec(self.parent_pid)
        else:
            import multiprocessing
            import tempfile

            self._mp = multiprocessing.get_context(start_method)
            self.result_dir = tempfile.mkdtemp(prefix=f"xrun-{name}-")
        if log_dir is not None:
            os.makedirs(log_dir, mode=0o700, exist_ok=True)

    def start(
        self,
        rank: int,
        args: tuple[Any, ...],
        env: Mapping[str, str],
        redirect: Std,
        tee: Std,
        prefix: str,
    ) -> None:
        rank_dir = self._rank_dir(rank)
        error_file = env.get(ERROR_FILE_ENV) or (
            os.path.join(rank_dir, "error.json") if rank_dir else None
        )
        if error_file is None and self.result_dir is not None:
            # Function workers always record their exception somewhere, log_dir or not.
            error_file = os.path.join(self.result_dir, f"{rank}.error.json")
        child_env = dict(env)
        if error_file:
            child_env.setdefault(ERROR_FILE_ENV, error_file)
            _remove(error_file)  # a file there now is a previous run's, not this worker's

        output = _RankOutput(rank, redirect, tee, prefix, rank_dir)
        to_close: list[int] = []
        try:
            targets = [
                self._stream_target(output, bit, console, log, to_close)
                for bit, console, log in _STREAMS
            ]
            if self._mp is None:
                self._start_binary(rank, args, child_env, targets[0], targets[1], error_file)
            else:
                self._start_function(rank, args, child_env, targets[0], targets[1], error_file)
        finally:
            # The child has its copies; ours would keep the pipes from ever reaching EOF.
            for fd in to_close:
                os.close(fd)

    def finish(self) -> tuple[list[Worker], Tee | None, str | None]:
        if len(self.tee):
            self.tee.start()  # only now: no thread of ours runs while workers fork
            return self.workers, self.tee, self.result_dir
        self.tee.close()
        return self.workers, None, self.result_dir

    def abort(self) -> None:
        """A later rank failed to start: take down the ones already running."""
        import signal

        for w in self.workers:
            w.killpg(signal.SIGKILL)
        for w in self.workers:
            if hasattr(w.handle, "wait"):
                w.handle.wait()
            else:
                w.handle.join()
            w.close_fd()
        self.tee.close(timeout=0)
        if self.result_dir is not None:
            import shutil

            shutil.rmtree(self.result_dir, ignore_errors=True)

    # -- per rank ----------------------------------------------------------------------------

    def _rank_dir(self, rank: int) -> str | None:
        if self.log_dir is None:
            return None
        path = os.path.join(self.log_dir, str(rank))
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # logs and tracebacks are for the user alone
        return path

    def _stream_target(
        self, output: _RankOutput, bit: Std, console: int, log: str, to_close: list[int]
    ) -> int | None:
        """The fd the worker's stream ``bit`` goes to; None: inherit the agent's console.
        Fds the child gets a copy of are added to ``to_close``."""
        rank, prefix = output.rank, output.prefix
        shown = self.ranks_filter is None or rank in self.ranks_filter
        to_file = output.redirect | output.tee
        paths = self.stdouts if bit is Std.OUT else self.stderrs
        file_fd = None
        if to_file & bit and output.rank_dir is not None:
            path = os.path.join(output.rank_dir, f"{log}.log")
            file_fd = _open_log(path)
            paths[rank] = path
        else:
            paths[rank] = ""
        if output.tee & bit and shown and file_fd is not None:
            # The worker writes its log file itself and the tee tails it (see tee.py).
            try:
                self.tee.add_file(paths[rank], console, prefix)
            except OSError:
                os.close(file_fd)
                raise
            to_close.append(file_fd)
            return file_fd
        if output.tee & bit and shown:
            try:
                r, w = make_pipe()
            except OSError:  # out of fds: do not leak the log file on the way out
                if file_fd is not None:
                    os.close(file_fd)
                raise
            self.tee.add(r, file_fd, console, prefix)  # the tee owns r and file_fd now
            to_close.append(w)
            return w
        if file_fd is not None:
            to_close.append(file_fd)
            return file_fd
        if shown and not to_file & bit:
            return None
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        to_close.append(devnull)
        return devnull

    def _start_binary(
        self,
        rank: int,
        args: tuple[Any, ...],
        env: dict[str, str],
        out: int | None,
        err: int | None,
        error_file: str | None,
    ) -> None:
        import subprocess

        assert isinstance(self.entrypoint, str)
        cmd = [self.entrypoint, *map(str, args)]
        try:
            proc = subprocess.Popen(
                cmd,
                env={**_inherited_env(), **env},
                stdout=out,
                stderr=err,
                preexec_fn=self._preexec,
                close_fds=True,
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise UsageError(
                f"cannot run worker binary {self.entrypoint!r} for local rank {rank}: "
                f"{exc.strerror}; give an executable path or a name on $PATH"
            ) from exc
        fd = _pidfd(proc.pid)
        self.workers.append(Worker(rank, proc.pid, proc, error_file, fd, owns_fd=True))

    def _start_function(
        self,
        rank: int,
        args: tuple[Any, ...],
        env: dict[str, str],
        out: int | None,
        err: int | None,
        error_file: str | None,
    ) -> None:
        payload: Any = (self.entrypoint, tuple(args))
        if self.start_method != "fork":
            import pickle

            try:
                payload = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise UsageError(
                    f"the entrypoint {getattr(self.entrypoint, '__qualname__', self.entrypoint)!r}"
                    f" or its args for local rank {rank} cannot be pickled ({exc}), which "
                    f"start_method {self.start_method!r} needs: define the function at module "
                    f"top level with picklable args, or use start_method='fork'"
                ) from exc
        assert self.result_dir is not None
        result_path = os.path.join(self.result_dir, f"{rank}.pkl")
        # Under forkserver our child's parent is the fork server, not us (see die_with_parent).
        parent = None if self.start_method == "forkserver" else self.parent_pid
        proc = self._mp.Process(
            target=function_main,
            args=(
                payload,
                env,
                _inherit(out),
                _inherit(err),
                result_path,
                parent,
                tuple(k for k in AGENT_ONLY_ENV if k not in env),
            ),
            name=f"{self.name}-{rank}",
        )
        proc.start()
        try:
            os.setpgid(proc.pid, proc.pid)  # the child does it too; whoever is first wins
        except OSError:
            pass
        fd: int | None = None if self.start_method == "forkserver" else _pidfd(proc.pid)
        if fd is None:
            # The fork server reports the exit status through the sentinel pipe; a pidfd
            # would turn readable before that status is there to read.
            self.workers.append(Worker(rank, proc.pid, proc, error_file, proc.sentinel, False))
        else:
            self.workers.append(Worker(rank, proc.pid, proc, error_file, fd, True))


def _inherited_env() -> dict[str, str]:
    """The agent's environment minus the rendezvous secret (see xrun.contract.AGENT_ONLY_ENV)."""
    return {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV}


def _inherit(fd: int | None) -> InheritFd | None:
    return None if fd is None else InheritFd(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
