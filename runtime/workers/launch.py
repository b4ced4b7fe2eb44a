"""The starting half of ``start_processes``: log files, pipes and the fork of each worker.

``OutputPlan`` turns the ``LogsDest`` of a ``LogsSpecs`` into what each worker's two streams
get (a log file, ``/dev/null``, the agent's console) and which are copied to the console by the
tee. Kept apart from ``api.py`` (the watching half) so that each stays small; ``worker.py``
holds the handle both use. ``subprocess`` is imported for binaries only,
``multiprocessing``/``pickle``/``tempfile`` for functions only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from xrun.contract import AGENT_ONLY_ENV
from xrun.errors import UsageError

from ..errors import ERROR_FILE_ENV
from .child import InheritFd, function_main, make_preexec
from .logs_specs import LogsDest
from .streams import Std
from .tee import Console, Tee, make_pipe
from .worker import Worker

__all__ = ["EntrypointNotFoundError", "Launcher", "OutputPlan"]

_STREAMS = ((Std.OUT, 1), (Std.ERR, 2))


class EntrypointNotFoundError(UsageError, FileNotFoundError):
    """The worker binary does not exist (torch raises FileNotFoundError)."""


class EntrypointPermissionError(UsageError, PermissionError):
    """The worker binary is not executable (torch raises PermissionError)."""


class StreamPlan(NamedTuple):
    """One stream of one rank: its file (``""``: the console, ``os.devnull``: nowhere) and
    whether the tee copies it to the console (with no file: through a pipe)."""

    path: str
    teed: bool


class OutputPlan(NamedTuple):
    """Every rank's two streams, error file and console prefix."""

    streams: dict[int, dict[Std, StreamPlan]]
    error_files: dict[int, str]
    prefixes: dict[int, str]

    @classmethod
    def build(
        cls, dest: LogsDest, name: str, n: int, prefixes: Mapping[int, str] | None
    ) -> OutputPlan:
        streams: dict[int, dict[Std, StreamPlan]] = {}
        for r in range(n):
            streams[r] = {}
            for bit, files, tees in (
                (Std.OUT, dest.stdouts, dest.tee_stdouts),
                (Std.ERR, dest.stderrs, dest.tee_stderrs),
            ):
                path = files.get(r, "")
                teed = r in tees and tees[r] == path and path != os.devnull
                streams[r][bit] = StreamPlan(path, teed)
        return cls(
            streams,
            {r: dest.error_files.get(r, "") for r in range(n)},
            # torch's default console prefix: [<name><local_rank>]:
            {r: (prefixes or {}).get(r, f"[{name}{r}]:") for r in range(n)},
        )


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


def _console(stream: Any, original: Any, fd: int) -> Console:
    """Where tee'd lines of fd ``fd``'s stream go: the fd itself while ``sys.stdout`` (or
    ``sys.stderr``) is the process's own, else that Python object (pytest's capture, Jupyter,
    ``contextlib.redirect_stdout``), as torch's tee writes to ``sys.stdout``."""
    if stream is None or stream is original:
        return Console(fd)
    return Console(fd, stream)


class Launcher:
    """Starts the workers of one ``start_processes`` call, one ``start`` per local rank."""

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        start_method: str,
        plan: OutputPlan,
        numa_options: Any = None,
        warm_pool: Any = None,
    ) -> None:
        self.name = name
        self.warm_pool = warm_pool  # --recover warm: pool.WarmPool, binaries only
        self.entrypoint = entrypoint
        self.start_method = start_method
        self.plan = plan
        self.parent_pid = os.getpid()
        self.workers: list[Worker] = []
        self.tee = Tee(f"{name}-tee")
        self.filtered: dict[Std, str] = {}
        self.result_dir: str | None = None
        self._consoles = {
            Std.OUT: _console(sys.stdout, sys.__stdout__, 1),
            Std.ERR: _console(sys.stderr, sys.__stderr__, 2),
        }
        self._filters: dict[Std, tuple[int, tuple[bytes, ...]]] = {}
        self._numa = None
        if numa_options is not None:
            from .numa import NumaBinding  # benchmark 1: --numa-binding only

            self._numa = NumaBinding.from_options(numa_options, len(plan.streams))
        self._mp: Any = None
        self.all_returned: Any = None
        if not isinstance(entrypoint, str):
            import multiprocessing  # benchmark 1: function entrypoints only (~9 ms)
            import tempfile  # benchmark 1: function entrypoints' results only

            self._mp = multiprocessing.get_context(start_method)
            self.result_dir = tempfile.mkdtemp(prefix=f"xrun-{name}-")
            # A function worker that returned waits here for its peers, as torch's do (on the
            # parent's "finished reading" event): all of a node's workers tear torch down
            # together. One that exits while its peers still talk to it over gloo now and
            # then dies of SIGABRT at exit ("terminate called without an active exception").
            self.all_returned = self._mp.Barrier(len(plan.streams))

    def add_filters(self, dest: LogsDest, out: list[str] | None, err: list[str] | None) -> None:
        """Tee'd lines containing any of ``out``/``err`` also go to the filtered log files."""
        for bit, needles, path in (
            (Std.OUT, out, dest.filtered_stdout),
            (Std.ERR, err, dest.filtered_stderr),
        ):
            if needles and path and path != os.devnull:
                self._filters[bit] = (_open_log(path), tuple(n.encode() for n in needles))
                self.tee.own(self._filters[bit][0])
                self.filtered[bit] = path

    def start(self, rank: int, args: tuple[Any, ...], env: Mapping[str, str]) -> None:
        error_file: str | None = self.plan.error_files.get(rank) or None
        if error_file == os.devnull:
            error_file = None
        child_env = dict(env)
        if error_file is None and self.result_dir is not None:
            # Function workers always record their exception somewhere, log_dir or not.
            error_file = os.path.join(self.result_dir, f"{rank}.error.json")
            child_env[ERROR_FILE_ENV] = error_file
        if error_file:
            _remove(error_file)  # a file there now is a previous run's, not this worker's

        to_close: list[int] = []
        try:
            targets = [
                self._stream_target(rank, bit, console, to_close) for bit, console in _STREAMS
            ]
            if self._mp is None:
                self._start_binary(rank, args, child_env, targets[0], targets[1], error_file)
            else:
                self._start_function(rank, args, child_env, targets[0], targets[1], error_file)
        finally:
            # The child has its copies; ours would keep the pipes from ever reaching EOF.
            for fd in to_close:
                os.close(fd)

    def finish(self) -> tuple[list[Worker], Tee, str | None]:
        self.tee.start()  # only now: no thread of ours runs while workers fork
        return self.workers, self.tee, self.result_dir

    def abort(self) -> None:
        """A later rank failed to start: take down the ones already running."""
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
            import shutil  # benchmark 1: function entrypoints' results only

            shutil.rmtree(self.result_dir, ignore_errors=True)

    # -- per rank ----------------------------------------------------------------------------

    def _stream_target(self, rank: int, bit: Std, console: int, to_close: list[int]) -> int | None:
        """The fd the worker's stream ``bit`` goes to; None: inherit the agent's console.
        Fds the child gets a copy of are added to ``to_close``."""
        stream = self.plan.streams[rank][bit]
        prefix = self.plan.prefixes[rank]
        target = self._consoles[bit]
        filt = self._filters.get(bit)
        if stream.path == os.devnull:
            fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            to_close.append(fd)
            return fd
        if stream.path:
            file_fd = _open_log(stream.path)
            to_close.append(file_fd)
            if stream.teed:
                # The worker writes its log file itself and the tee tails it (see tee.py).
                self.tee.add_file(stream.path, target, prefix, filt)
            return file_fd
        if not stream.teed:
            return None
        r, w = make_pipe()
        self.tee.add(r, None, target, prefix, filt)  # the tee owns r now
        to_close.append(w)
        return w

    def _start_binary(
        self,
        rank: int,
        args: tuple[Any, ...],
        env: dict[str, str],
        out: int | None,
        err: int | None,
        error_file: str | None,
    ) -> None:
        assert isinstance(self.entrypoint, str)
        cmd = [self.entrypoint, *map(str, args)]
        cpus = self._numa.cpus(rank) if self._numa is not None else None
        warm = self.warm_pool.serves(cmd) if self.warm_pool is not None else None
        try:
            if warm is not None:  # --recover warm: an interpreter of the pool runs it
                proc = self.warm_pool.start(rank, warm, {**_inherited_env(), **env}, out, err, cpus)
                self.workers.append(
                    Worker(rank, proc.pid, proc, error_file, _pidfd(proc.pid), True)
                )
                return
            proc = subprocess.Popen(
                cmd,
                env={**_inherited_env(), **env},
                stdout=out,
                stderr=err,
                preexec_fn=make_preexec(self.parent_pid, cpus),
                close_fds=True,
            )
        except FileNotFoundError as exc:
            raise EntrypointNotFoundError(
                f"cannot run worker binary {self.entrypoint!r} for local rank {rank}: "
                f"{exc.strerror}; give an executable path or a name on $PATH"
            ) from exc
        except PermissionError as exc:
            raise EntrypointPermissionError(
                f"cannot run worker binary {self.entrypoint!r} for local rank {rank}: "
                f"{exc.strerror}; make it executable (chmod +x) or run it through its interpreter"
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
            import pickle  # benchmark 1: spawned function entrypoints only

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
                self._numa.cpus(rank) if self._numa is not None else None,
                self.all_returned,
            ),
            name=f"{self.name}-{rank}",
        )
        proc.start()
        # The child makes its own session first thing (setsid); until then a signal to its
        # group reaches the pid alone (Worker.killpg).
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
