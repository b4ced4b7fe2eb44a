"""Start and watch the local workers: ``start_processes`` -> ``PContext``.

A worker is either a Python function (multiprocessing: spawn, forkserver or fork) or a binary
(subprocess). Each one

* runs in its own process group, so ``signal``/``close`` reach the worker's children too;
* dies with the agent (``PR_SET_PDEATHSIG=SIGKILL``, see ``child.py``);
* is watched through a pidfd (or the forkserver's status pipe): ``fds()`` become readable the
  moment a worker exits, and ``wait`` sleeps in ``select`` on them, never in a polling loop;
* writes ``<log_dir>/<local_rank>/{stdout.log,stderr.log,error.json}`` (dirs 0700, files 0600)
  when redirected or tee'd; tee goes through ``tee.Tee``.

This module is the watching half; ``launch.py`` starts the processes and ``worker.py`` is the
handle the two share. Standard library only, and imports stay lazy: a binary launch never
imports multiprocessing or pickle.
"""

from __future__ import annotations

import os
import signal as _signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xrun.errors import UsageError

from ..errors import ProcessFailure
from .streams import Std
from .worker import Worker

if TYPE_CHECKING:
    from .tee import Tee

__all__ = ["PContext", "RunProcsResult", "Std", "start_processes"]

_START_METHODS = ("spawn", "forkserver", "fork")


@dataclass
class RunProcsResult:
    """What ``PContext.wait`` saw. Failed ranks are in ``failures``; ranks that finished well
    (function entrypoints) have their return value in ``return_values``."""

    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return bool(self.failures)


class PContext:
    """The running local workers (returned by ``start_processes``)."""

    def __init__(
        self,
        name: str,
        workers: list[Worker],
        tee: Tee | None,
        stdouts: dict[int, str],
        stderrs: dict[int, str],
        result_dir: str | None,
    ) -> None:
        self.name = name
        self._workers = workers
        self._tee = tee
        self._stdouts = stdouts
        self._stderrs = stderrs
        self._result_dir = result_dir
        self._return_values: dict[int, Any] = {}
        self._failures: dict[int, ProcessFailure] = {}  # read each error file once
        self._closed = False

    def __enter__(self) -> PContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> dict[int, int]:
        return {w.local_rank: w.pid for w in self._workers}

    def fds(self) -> list[int]:
        """Fds that turn readable when a still-running worker exits (for the agent's select)."""
        return [w.fd for w in self._workers if w.exitcode is None and w.fd is not None]

    def wait(self, timeout: float = -1) -> RunProcsResult | None:
        """The result once every rank succeeded or any rank failed, else None after
        ``timeout`` s (0: just look; -1: no limit). Ranks still running when one fails are
        left running: the caller decides (usually ``close``)."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            self._reap()
            done = self._result_if_done()
            if done is not None:
                return done
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._sleep(remaining)

    def signal(self, sig: int) -> None:
        """Forward ``sig`` to every running worker's process group."""
        for w in self._workers:
            if w.poll() is None:
                w.killpg(sig)

    def close(self, death_sig: int = _signal.SIGTERM, timeout: float = 30) -> None:
        """``death_sig`` to every worker's group, up to ``timeout`` s for them to exit, SIGKILL
        for the rest; reap all, flush the tee. Idempotent."""
        if self._closed:
            return
        self._closed = True
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
        if self._tee is not None:
            self._tee.close()
        if self._result_dir is not None:
            import shutil

            shutil.rmtree(self._result_dir, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------

    def _sleep(self, timeout: float | None) -> None:
        """Block until a worker may have exited, or ``timeout`` s (None: no limit)."""
        fds = self.fds()
        if any(w.exitcode is None and w.fd is None for w in self._workers):
            # No pidfd (Linux < 5.3) for some worker: the one case where we must poll.
            timeout = 0.05 if timeout is None else min(0.05, timeout)
        import select

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
        import pickle

        path = os.path.join(self._result_dir or "", f"{rank}.pkl")
        try:
            with open(path, "rb") as fp:
                return pickle.load(fp)
        except FileNotFoundError:  # the function called sys.exit(0)
            return None

    def _result_if_done(self) -> RunProcsResult | None:
        failures = self._failures
        for w in self._workers:
            if w.exitcode not in (None, 0) and w.local_rank not in failures:
                failures[w.local_rank] = ProcessFailure.from_exit(
                    w.local_rank, w.pid, w.exitcode, w.error_file, w.exit_time
                )
        if not failures and any(w.exitcode is None for w in self._workers):
            return None
        return RunProcsResult(
            return_values=dict(self._return_values),
            failures=dict(failures),
            stdouts=dict(self._stdouts),
            stderrs=dict(self._stderrs),
        )


def _join(w: Worker) -> None:
    # After SIGKILL to its group the process is gone within a moment; a blocking reap is safe.
    if hasattr(w.handle, "wait"):
        w.handle.wait()
    else:
        w.handle.join()
    w.poll()


def _check_ranks(what: str, keys: Any, n: int) -> None:
    got = set(keys)
    want = set(range(n))
    if got != want:
        missing = sorted(want - got)
        extra = sorted(got - want)
        parts = []
        if missing:
            parts.append(f"missing local ranks {missing}")
        if extra:
            parts.append(f"unexpected local ranks {extra}")
        raise UsageError(
            f"{what} must have one entry per local rank 0..{n - 1}: {', '.join(parts)}"
        )


def _per_rank(value: Std | Mapping[int, Std], what: str, n: int) -> dict[int, Std]:
    if isinstance(value, Mapping):
        extra = sorted(set(value) - set(range(n)))
        if extra:
            raise UsageError(
                f"{what} names local ranks {extra} but there are {n} workers (ranks 0..{n - 1})"
            )
        return {r: Std(value.get(r, Std.NONE)) for r in range(n)}
    return dict.fromkeys(range(n), Std(value))


def start_processes(  # noqa: PLR0913 - mirrors torch's start_processes signature
    name: str,
    entrypoint: Callable[..., Any] | str,
    args: Mapping[int, tuple[Any, ...]],
    envs: Mapping[int, Mapping[str, str]],
    log_dir: str | None = None,
    redirects: Std | Mapping[int, Std] = Std.NONE,
    tee: Std | Mapping[int, Std] = Std.NONE,
    log_line_prefixes: Mapping[int, str] | None = None,
    start_method: str = "spawn",
    local_ranks_filter: set[int] | None = None,
) -> PContext:
    """Start ``len(args)`` workers of ``entrypoint`` and return their ``PContext``.

    ``entrypoint`` is a function (run with multiprocessing ``start_method``; it and its args
    must pickle unless ``fork``) or a binary (``args`` are its command-line arguments).
    ``envs[r]`` is added to ``os.environ`` for local rank ``r`` (minus the rendezvous secret,
    ``$XRUN_RDZV_TOKEN``/``$XRUN_RDZV_TOKEN_FILE``, unless ``envs`` sets it). Per stream, ``tee`` sends the
    output to ``<log_dir>/<r>/std{out,err}.log`` and to the console with the rank's prefix;
    ``redirects`` to the file only; neither leaves the console. ``local_ranks_filter`` limits
    console output to those ranks. With a ``log_dir`` each worker's
    ``$TORCHELASTIC_ERROR_FILE`` is ``<log_dir>/<r>/error.json`` unless ``envs`` sets it.

    Call it from the main (or another long-lived) thread: the kernel's parent-death signal,
    which takes the workers down with the agent, fires when the *thread* that forked them ends.
    Example::

        ctx = start_processes("trainer", sys.executable, {0: ("-u", "train.py")},
                              {0: {"RANK": "0"}}, log_dir="/tmp/logs", tee=Std.ALL,
                              log_line_prefixes={0: "[trainer0]:"})
        result = ctx.wait()
        ctx.close()
    """
    n = len(args)
    if n == 0:
        raise UsageError("start_processes needs at least one worker: args is empty")
    _check_ranks("args", args.keys(), n)
    _check_ranks("envs", envs.keys(), n)
    is_fn = not isinstance(entrypoint, str)
    if is_fn and start_method not in _START_METHODS:
        raise UsageError(
            f"bad start method {start_method!r}: expected one of {', '.join(_START_METHODS)}"
        )
    redirect_of = _per_rank(redirects, "redirects", n)
    tee_of = _per_rank(tee, "tee", n)
    if log_dir is None and any(redirect_of[r] & ~tee_of[r] for r in range(n)):
        raise UsageError(
            "redirects need a log_dir to write <log_dir>/<local_rank>/stdout.log: "
            "pass log_dir or drop the redirects"
        )

    from .launch import Launcher

    launcher = Launcher(name, entrypoint, start_method, log_dir, local_ranks_filter)
    try:
        for r in range(n):
            prefix = (log_line_prefixes or {}).get(r, "")
            launcher.start(r, args[r], envs[r], redirect_of[r], tee_of[r], prefix)
    except BaseException:
        launcher.abort()
        raise
    workers, tee_obj, result_dir = launcher.finish()
    return PContext(name, workers, tee_obj, launcher.stdouts, launcher.stderrs, result_dir)
