"""Start and watch the local workers: ``start_processes`` -> ``PContext`` (torch 2.13's API).

A worker is either a Python function (multiprocessing: spawn, forkserver or fork) or a binary
(subprocess). Each one

* runs in its own session (``setsid``, as torchrun's), so ``signal``/``close`` reach the
  worker's children too and a worker reading a terminal is never stopped by SIGTTIN;
* dies with the agent (``PR_SET_PDEATHSIG=SIGKILL``, see ``child.py``);
* is watched through a pidfd (or the forkserver's status pipe): ``fds()`` become readable the
  moment a worker exits, and ``wait`` sleeps in ``poll`` on them, never in a polling loop;
* writes its output where the ``LogsSpecs`` says (``logs_specs.py``); tee'd streams are
  copied to ``sys.stdout``/``sys.stderr`` by ``tee.Tee``.

When one worker fails, ``wait`` stops the others as torch does (SIGTERM to their groups, then
SIGKILL after ``stop_timeout``), reaps them and flushes the tee before it returns: binaries'
stopped siblings appear among the failures (exit code -15), as in torch's
``SubprocessContext``; a function context reports the workers that failed on their own.

This module is the watching half; ``launch.py`` starts the processes and ``worker.py`` is the
handle the two share. Standard library only, and imports stay lazy: a binary launch never
imports multiprocessing or pickle.
"""

from __future__ import annotations

import os
import select
import signal as _signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xrun.errors import UsageError

from ..errors import ProcessFailure
from .launch import Launcher, OutputPlan
from .logs_specs import DefaultLogsSpecs, LogsDest, LogsSpecs, RankDirLogsSpecs
from .streams import Std
from .worker import Worker

if TYPE_CHECKING:
    from .tee import Tee

__all__ = [
    "DefaultLogsSpecs",
    "LogsSpecs",
    "PContext",
    "RankMismatchError",
    "RunProcsResult",
    "Std",
    "check_full_rank",
    "start_processes",
]

_START_METHODS = ("spawn", "forkserver", "fork")


class RankMismatchError(UsageError, RuntimeError):
    """A per-rank mapping misses or adds local ranks (torch raises RuntimeError here)."""


@dataclass
class RunProcsResult:
    """What ``PContext.wait`` saw, by local rank. Failed ranks are in ``failures``; on success
    ``return_values`` has every rank (a function's return value, None for a binary);
    ``stdouts``/``stderrs`` are the log files ("" where a stream was not redirected)."""

    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return bool(self.failures)


class PContext:
    """The running local workers (returned by ``start_processes``), with torch's attributes:
    ``name``, ``entrypoint``, ``args``, ``envs``, ``nprocs``, ``stdouts``, ``stderrs``,
    ``error_files``, ``filtered_stdout``/``filtered_stderr`` (paths, or None)."""

    def __init__(  # noqa: PLR0913 - the launch's parts, all kept as torch's attributes
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        args: Mapping[int, tuple[Any, ...]],
        envs: Mapping[int, Mapping[str, str]],
        dest: LogsDest,
        workers: list[Worker],
        tee: Tee,
        result_dir: str | None,
        stop_timeout: float,
    ) -> None:
        self.name = name
        self.entrypoint = entrypoint
        self.args = dict(args)
        self.envs = dict(envs)
        self.nprocs = len(workers)
        # The log files; "" where a stream has none (the console, or discarded).
        self.stdouts = {r: _file(p) for r, p in dest.stdouts.items()}
        self.stderrs = {r: _file(p) for r, p in dest.stderrs.items()}
        self.error_files = dest.error_files
        self.filtered_stdout: str | None = None
        self.filtered_stderr: str | None = None
        self.tee = tee
        self.stop_timeout = stop_timeout
        self._workers = workers
        self._result_dir = result_dir
        self._is_binary = isinstance(entrypoint, str)
        self._return_values: dict[int, Any] = {}
        self._failures: dict[int, ProcessFailure] = {}  # read each error file once
        self._result: RunProcsResult | None = None
        self.all_returned: Any = None  # function workers' barrier (see Launcher)
        # Called with the failed local ranks before the survivors of a failure are stopped
        # (the agent reads their stacks then: runtime/diagnose).
        self.before_stop: Callable[[frozenset[int]], None] | None = None
        # --recover warm: the survivors of a failure are SIGKILLed at once (close_for_restart)
        self.kill_survivors = False
        self._closed = False

    def __enter__(self) -> PContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> dict[int, int]:
        return {w.local_rank: w.pid for w in self._workers}

    def sent_signals(self) -> dict[int, tuple[int, ...]]:
        """The signals this context sent each worker (by local rank) while it still ran."""
        return {w.local_rank: tuple(w.sent) for w in self._workers}

    def fds(self) -> list[int]:
        """Fds that turn readable when a still-running worker exits (for the agent's select)."""
        return [w.fd for w in self._workers if w.exitcode is None and w.fd is not None]

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None:
        """The result once every rank succeeded or any rank failed, else None after
        ``timeout`` s (0: just look; -1: no limit). Either way the workers are reaped, the
        survivors of a failure stopped and the tee flushed before it returns.

        Exits wake it at once; ``period`` only matters after a failure while others still
        run: they get ``period`` s to end on their own before they are stopped. torch polls
        every ``period`` s, so what it reports depends on where its tick falls (a sibling
        ending 1 ms after the failure may or may not be a casualty); a full ``period`` is at
        least as lenient in every case, and the same every run.
        """
        if self._result is not None:
            return self._result
        start = time.monotonic()
        deadline = None if timeout < 0 else start + timeout
        while True:
            running = self._reap()
            if self._own_failures():
                if running and timeout != 0 and period > 0:
                    self._settle(period)
                return self._finish()
            if not running:
                return self._finish()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._sleep(remaining)

    def signal(self, sig: int) -> None:
        """Forward ``sig`` to every running worker's process group."""
        for w in self._workers:
            if w.poll() is None:
                w.killpg(sig)

    def close(self, death_sig: int | None = None, timeout: float | None = None) -> None:
        """``death_sig`` (SIGTERM) to every worker's group, up to ``timeout`` s
        (``stop_timeout``) for them to exit, SIGKILL for the rest; reap all, flush the tee.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop(death_sig or _signal.SIGTERM, self.stop_timeout if timeout is None else timeout)
        self.tee.close()
        if self._result_dir is not None:
            import shutil  # benchmark 1: function entrypoints' results only

            shutil.rmtree(self._result_dir, ignore_errors=True)

    def close_for_restart(self, timeout: float) -> None:
        """``close`` before a restart: SIGTERM and ``timeout`` s, or with ``kill_survivors``
        SIGKILL at once. Workers being replaced from a warm pool need no grace (their state is
        in the snapshot, written to survive a kill), and a grace is what a failure cost:
        a rank that handles SIGTERM itself (``xrun.runtime.stop`` notes it) runs on until its
        collective fails and its interpreter tears torch down, 2.7-3.7 s on a 2-core host
        (docs/benchmark-runs/2026-11-27-warm-breakdown.txt), or hangs for the whole
        ``timeout`` when the collective does not fail."""
        if self.kill_survivors:
            self.close(_signal.SIGKILL, 0)
        else:
            self.close(_signal.SIGTERM, timeout)

    # -- internals -------------------------------------------------------------------------

    def _stop(self, death_sig: int, timeout: float) -> None:
        # Exited workers' groups too: a worker's own children (data loaders...) outlive it.
        for w in self._workers:
            w.killpg(death_sig)
        deadline = time.monotonic() + timeout
        while self._reap() and time.monotonic() < deadline:
            self._sleep(deadline - time.monotonic())
        for w in self._workers:
            w.killpg(_signal.SIGKILL)
        for w in self._workers:
            if w.poll() is None:
                _join(w)
        self._reap()

    def _settle(self, period: float) -> None:
        until = time.monotonic() + period
        while self._reap() and time.monotonic() < until:
            self._sleep(until - time.monotonic())
        self._reap()

    def _own_failures(self) -> dict[int, ProcessFailure]:
        """Record every worker that exited non-zero so far (once each)."""
        for w in self._workers:
            if w.exitcode not in (None, 0) and w.local_rank not in self._failures:
                f = ProcessFailure.from_exit(
                    w.local_rank, w.pid, w.exitcode, w.error_file, w.exit_time
                )
                f.seen_alive = w.seen_alive
                # killed by a signal the agent did not send (kill -9, the OOM killer, a crash)
                f.outside = w.exitcode < 0 and -w.exitcode not in w.sent
                self._failures[w.local_rank] = f
        return self._failures

    def _finish(self) -> RunProcsResult:
        own = dict(self._own_failures())
        if own and self.before_stop is not None and not self._closed:
            self.before_stop(frozenset(own))
        if own:
            self.close_for_restart(self.stop_timeout)
        else:
            self.close()
        if own:
            # Binaries: the siblings stopped above count as failures too (torch's
            # SubprocessContext); functions: only the ranks that failed on their own.
            failures = dict(self._own_failures()) if self._is_binary else own
            result = RunProcsResult(failures=failures)
        elif self._is_binary:
            result = RunProcsResult(return_values=dict.fromkeys(range(self.nprocs)))
        else:
            result = RunProcsResult(return_values=dict(self._return_values))
        result.stdouts = dict(self.stdouts)
        result.stderrs = dict(self.stderrs)
        self._result = result
        return result

    def _sleep(self, timeout: float | None) -> None:
        """Block until a worker may have exited, or ``timeout`` s (None: no limit)."""
        fds = self.fds()
        if any(w.exitcode is None and w.fd is None for w in self._workers):
            # No pidfd (Linux < 5.3) for some worker: the one case where we must poll.
            timeout = 0.05 if timeout is None else min(0.05, timeout)
        # poll, not select: select fails on fd numbers above 1024, which a busy agent reaches.
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(None if timeout is None else max(0.0, timeout) * 1000)

    def _reap(self) -> int:
        """Collect every exited worker; the number still running."""
        running = 0
        for w in self._workers:
            was_running = w.exitcode is None
            if w.poll() is None:
                running += 1
            elif was_running and w.exitcode == 0 and self._result_dir is not None:
                self._return_values[w.local_rank] = self._load_return(w.local_rank)
        return running

    def _load_return(self, rank: int) -> Any:
        import pickle  # benchmark 1: function entrypoints' results only

        path = os.path.join(self._result_dir or "", f"{rank}.pkl")
        try:
            with open(path, "rb") as fp:
                return pickle.load(fp)
        except FileNotFoundError:  # the function called sys.exit(0)
            return None


def _file(path: str) -> str:
    return "" if path == os.devnull else path


def _join(w: Worker) -> None:
    # After SIGKILL to its group the process is gone within a moment; a blocking reap is safe.
    if hasattr(w.handle, "wait"):
        w.handle.wait()
    else:
        w.handle.join()
    w.poll()


def check_full_rank(d: Mapping[int, Any], nprocs: int, what: str) -> None:
    """``d`` must have exactly the local ranks ``0..nprocs-1`` (torch's ``_validate_full_rank``;
    raises ``RankMismatchError``, a ``RuntimeError`` as torch's)."""
    got = set(d)
    want = set(range(nprocs))
    if got != want:
        parts = []
        if want - got:
            parts.append(f"missing local ranks {sorted(want - got)}")
        if got - want:
            parts.append(f"unexpected local ranks {sorted(got - want)}")
        raise RankMismatchError(
            f"{what} must have one entry per local rank 0..{nprocs - 1}: {', '.join(parts)}"
        )


def _check_extra(value: Std | Mapping[int, Std], what: str, n: int) -> None:
    if isinstance(value, Mapping):
        extra = sorted(set(value) - set(range(n)))
        if extra:
            raise UsageError(
                f"{what} names local ranks {extra} but there are {n} workers (ranks 0..{n - 1})"
            )


def start_processes(  # noqa: PLR0913 - torch 2.13's signature, plus xrun's keyword-only short forms
    name: str,
    entrypoint: Callable[..., Any] | str,
    args: Mapping[int, tuple[Any, ...]],
    envs: Mapping[int, Mapping[str, str]],
    logs_specs: LogsSpecs | None = None,
    log_line_prefixes: Mapping[int, str] | None = None,
    start_method: str = "spawn",
    numa_options: Any = None,
    duplicate_stdout_filters: list[str] | None = None,
    duplicate_stderr_filters: list[str] | None = None,
    *,
    log_dir: str | None = None,
    redirects: Std | Mapping[int, Std] = Std.NONE,
    tee: Std | Mapping[int, Std] = Std.NONE,
    local_ranks_filter: set[int] | None = None,
    stop_timeout: float = 30,
    warm_pool: Any = None,
) -> PContext:
    """Start ``len(args)`` workers of ``entrypoint`` and return their ``PContext``.

    ``entrypoint`` is a function (run with multiprocessing ``start_method``; it and its args
    must pickle unless ``fork``) or a binary (``args`` are its command-line arguments).
    ``envs[r]`` is added to ``os.environ`` for local rank ``r`` (minus the rendezvous secret,
    ``$XRUN_RDZV_TOKEN``/``$XRUN_RDZV_TOKEN_FILE``, unless ``envs`` sets it).

    Where the output goes: torch's ``logs_specs`` (e.g. ``DefaultLogsSpecs(log_dir, redirects,
    tee)``), or xrun's short form ``log_dir=``/``redirects=``/``tee=``/``local_ranks_filter=``
    (``<log_dir>/<r>/std{out,err}.log`` and ``error.json``). Per stream, ``tee`` sends the
    output to the log file and to ``sys.stdout``/``sys.stderr`` with the rank's prefix
    (``log_line_prefixes[r]``, default ``[<name><r>]:``); ``redirects`` to the file only.
    ``duplicate_std{out,err}_filters``: tee'd lines containing any of the strings also go to
    ``filtered_std{out,err}.log``. ``numa_options`` (torch's ``NumaOptions`` or anything with an
    ``affinity_mode``) binds each worker to the CPUs near GPU ``r``. ``stop_timeout``: how long
    stopped workers get between SIGTERM and SIGKILL. ``warm_pool`` (``pool.WarmPool``, the
    agent's ``--recover warm``): binaries it serves are run by its interpreters.

    Call it from the main (or another long-lived) thread: the kernel's parent-death signal,
    which takes the workers down with the agent, fires when the *thread* that forked them ends.
    Example::

        ctx = start_processes("trainer", sys.executable, {0: ("-u", "train.py")},
                              {0: {"RANK": "0"}}, log_dir="/tmp/logs", tee=Std.ALL)
        result = ctx.wait()
    """
    n = len(args)
    if n == 0:
        raise UsageError("start_processes needs at least one worker: args is empty")
    check_full_rank(args, n, "args")
    check_full_rank(envs, n, "envs")
    if not isinstance(entrypoint, str) and start_method not in _START_METHODS:
        raise UsageError(
            f"bad start method {start_method!r}: expected one of {', '.join(_START_METHODS)}"
        )
    if logs_specs is None:
        _check_extra(redirects, "redirects", n)
        _check_extra(tee, "tee", n)
        logs_specs = RankDirLogsSpecs(log_dir, redirects, tee, local_ranks_filter)
    elif log_dir is not None or redirects or tee or local_ranks_filter:
        raise UsageError(
            "pass either logs_specs or log_dir/redirects/tee/local_ranks_filter, not both"
        )
    worker_envs = {r: dict(envs[r]) for r in range(n)}
    dest = logs_specs.reify(worker_envs)

    plan = OutputPlan.build(dest, name, n, log_line_prefixes)
    launcher = Launcher(name, entrypoint, start_method, plan, numa_options, warm_pool)
    try:
        launcher.add_filters(dest, duplicate_stdout_filters, duplicate_stderr_filters)
        for r in range(n):
            launcher.start(r, args[r], worker_envs[r])
    except BaseException:
        launcher.abort()
        raise
    workers, tee_obj, result_dir = launcher.finish()
    pc = PContext(
        name, entrypoint, args, worker_envs, dest, workers, tee_obj, result_dir, stop_timeout
    )
    pc.filtered_stdout = launcher.filtered.get(Std.OUT)
    pc.filtered_stderr = launcher.filtered.get(Std.ERR)
    # Held as long as the context: under spawn the barrier's semaphores are unlinked when the
    # parent's last reference goes, and a child that has not opened them yet could not.
    pc.all_returned = launcher.all_returned
    return pc
