"""What ``xrun.submit`` returns: a :class:`Job` (an app of any scheduler) or a
:class:`DebugJob` (the function called in this process), with one API.

``result()`` blocks until the outcome is in (without retries: as soon as the workers wrote it,
while the job may still be ending; ``wait()`` waits for the end) or the job ended, and returns
rank 0's value (every rank's, in rank order, for ``all_ranks=True``), or raises what the call raised, its remote traceback attached as a
note (``add_note``) and as ``exc.remote_traceback``; ``exception()`` returns that exception
instead (None when the call succeeded). A job that ended without an outcome (cancelled, killed,
a worker that could not start) gives a :class:`CallFailedError` naming the job's state and
message.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from xrun.calls.files import (
    DEFAULT_MAX_BYTES,
    ERROR,
    JOB_FILE,
    Attempt,
    attempt_dir,
    latest_attempt,
    load,
    outcome_file,
    outcome_ranks,
    place,
    read_small,
)
from xrun.specs import AppState, AppStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from xrun.runner import Runner

R = TypeVar("R")

# How often result() looks for the outcome file while the job runs.
_FOLDER_POLL_S = 0.05
# How long a job that ended short of its outcome (SUCCEEDED without rank 0's, or every rank's
# with all_ranks; FAILED without any) is looked at again before the outcome counts as missing:
# on NFS the scheduler can say the job ended before this host sees the files its workers wrote
# on another (attribute caching; each look lists the folder, which revalidates it). A job whose
# outcome is there never waits, nor one of a scheduler in _ONE_HOST, nor past a caller's timeout.
OUTCOME_LAG_S = 5.0
_LAG_POLL_S = 0.2
# The schedulers whose workers run on the caller's host (local_cwd's processes; docker's
# containers, the folder bind-mounted from this host): what a worker wrote is seen at once, so
# a missing outcome is missing (an OOM kill, a segfault), not late. Any other (slurm, a plugin)
# may run them on hosts that share the folder over a network file system.
_ONE_HOST = ("local_cwd", "docker", "local_docker")

# The runtime agent's tee prefix of a worker's line: ``[default0]:`` (torch's ``[<role><local
# rank>]:``; TorchX's dist.ddp prints ``[0]:``).
_PREFIX = re.compile(r"\[[A-Za-z_]*(\d+)\]:")


_runner: Runner | None = None


def default_runner() -> Runner:
    """One Runner for every job this process submits or attaches to (schedulers cached)."""
    global _runner
    if _runner is None:
        from xrun.runner import get_runner

        _runner = get_runner()
    return _runner


class CallFailedError(RuntimeError):
    """The job ended without the call's value or exception (cancelled, killed, not started)."""


def _attach(exc: BaseException, tb: str, where: str) -> BaseException:
    """``exc`` with the remote traceback ``tb`` as a note and as ``remote_traceback``."""
    note = f"\n{where}, remote traceback:\n{tb.rstrip()}"
    if note not in getattr(exc, "__notes__", ()) and hasattr(exc, "add_note"):
        exc.add_note(note)  # Python 3.11+ prints it under the exception; 3.10: the attribute
    with contextlib.suppress(AttributeError, TypeError):  # an exception class with __slots__
        exc.remote_traceback = tb  # type: ignore[attr-defined]
    return exc


class Job(Generic[R]):
    """One submitted call: the app ``handle`` (``scheduler://session/app_id``) and the call's
    folder (``folder``), where the outcome comes back."""

    def __init__(  # noqa: PLR0913  (made by submit only; each value read by one verb)
        self,
        runner: Runner,
        handle: str,
        folder: Path,
        role: str,
        *,
        all_ranks: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
        nproc_per_node: int = 1,
        world: int | None = None,
        early: bool = False,
    ) -> None:
        self._runner, self.handle, self.folder, self.role = runner, handle, folder, role
        self.all_ranks, self.max_bytes = all_ranks, max_bytes
        self.nproc_per_node = nproc_per_node
        # The ranks (a fixed -j), and whether an outcome is final once written (no retries):
        # then result() returns when the outcome is in, not when the scheduler says the job
        # ended (on Slurm ~0.3-0.7 s later: the agents' exit, squeue).
        self.world, self.early = world, early
        self._final: AppStatus | None = None
        # Whether an outcome can show late: the folder is seen from another host (NFS); and
        # once the job ended short of its outcome, until when it is looked for (one lag per job,
        # not one per call: a caller's timeout may cut a look short, the next one goes on).
        self._may_lag = handle.split("://", 1)[0] not in _ONE_HOST
        self._lag_until: float | None = None

    # ------------------------------------------------------------------ finding it again
    def save(self) -> None:
        """Write what :meth:`attach` needs into the call's folder (``job.json``)."""
        facts = {
            "handle": self.handle,
            "role": self.role,
            "all_ranks": self.all_ranks,
            "max_bytes": self.max_bytes,
            "nproc_per_node": self.nproc_per_node,
            "world": self.world,
            "early": self.early,
        }
        tmp = self.folder / f"{JOB_FILE}.tmp"
        tmp.write_text(json.dumps(facts))
        tmp.replace(self.folder / JOB_FILE)

    @classmethod
    def attach(cls, folder: str | Path, runner: Runner | None = None) -> Job[Any]:
        """The :class:`Job` of the call whose folder is ``folder`` (``job.folder``), from any
        process, later (submitit's ``Job(folder, job_id)``): ``result()``, ``status()``,
        ``cancel()``, ... work as on the job ``submit`` returned."""
        from xrun.errors import UsageError

        path = Path(folder) / JOB_FILE
        try:
            facts = json.loads(read_small(path))
            handle, role = str(facts["handle"]), str(facts["role"])
            world = facts["world"]
            job: Job[Any] = cls(
                runner or default_runner(),
                handle,
                Path(folder),
                role,
                all_ranks=bool(facts["all_ranks"]),
                max_bytes=int(facts["max_bytes"]),
                nproc_per_node=int(facts["nproc_per_node"]),
                world=None if world is None else int(world),
                early=bool(facts["early"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}"
            raise UsageError(
                f"xrun.Job.attach: {str(folder)!r} is no call's folder ({path.name}: {why}); "
                "give the folder of a submitted call (job.folder)"
            ) from None
        return job

    @property
    def job_id(self) -> str:
        """The scheduler's id for the app (the handle after the session: on Slurm the job
        id; ``SWEEP/TRIAL`` for a call of a map_array)."""
        return self.handle.split("://", 1)[-1].split("/", 1)[-1]

    def __repr__(self) -> str:
        return f"Job({self.handle!r})"

    # ------------------------------------------------------------------ state
    def status(self) -> AppState:
        """The app's state now (PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED, ...)."""
        if self._final is not None:
            return self._final.state
        st = self._runner.status(self.handle)
        if not isinstance(st, AppStatus):
            return AppState.UNKNOWN
        if st.is_terminal():
            self._final = st
        return st.state

    def done(self) -> bool:
        return self.status() in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)

    def wait(self, timeout: float | None = None) -> AppStatus:
        """Block until the job ends; its final status. TimeoutError after ``timeout`` s."""
        if self._final is None:
            st = self._runner.wait(self.handle, wait_interval=1, timeout=timeout)
            if not isinstance(st, AppStatus):
                raise CallFailedError(f"{self.handle} is unknown to its scheduler")
            if not st.is_terminal():
                raise TimeoutError(f"{self.handle} still {st.state.name} after {timeout:g} s")
            self._final = st
        return self._final

    def cancel(self) -> None:
        """Stop the job (it ends CANCELLED); nothing when it has already ended."""
        self._runner.cancel(self.handle)

    def stdout(self, rank: int = 0) -> str:
        """What ``rank``'s call printed so far (the scheduler's log of its replica, each line's
        ``[default<local rank>]:`` prefix taken off)."""
        return self._log(rank, "stdout")

    def stderr(self, rank: int = 0) -> str:
        """``rank``'s stderr so far: a failed call's traceback, the agent's root cause."""
        return self._log(rank, "stderr")

    def _log(self, rank: int, stream: str) -> str:
        from xrun.schedulers.api import Stream

        replica, local = place(self.folder, rank, self.nproc_per_node)
        lines = self._runner.log_lines(self.handle, self.role, replica, streams=Stream(stream))
        out = []
        for line in lines:
            m = _PREFIX.match(line)
            if m is None or int(m.group(1)) == local:  # the agent's own lines too
                out.append(line[m.end() :] if m else line)
        return "".join(line if line.endswith("\n") else line + "\n" for line in out)

    # ------------------------------------------------------------------ outcome
    def _latest(self) -> tuple[Attempt | None, list[int]]:
        """The latest attempt that started, and the ranks with an outcome in it: only these
        count (an earlier attempt's may be there too, see :mod:`xrun.calls.files`)."""
        attempt = latest_attempt(self.folder)
        if attempt is None:
            return None, []
        return attempt, outcome_ranks(attempt_dir(self.folder, attempt))

    def _outcome(self, attempt: Attempt | None, rank: int) -> tuple[Any, ...] | None:
        if attempt is None:
            return None
        path = outcome_file(attempt_dir(self.folder, attempt), rank)
        try:
            out = load(path, self.max_bytes, f"the outcome of rank {rank}")
        except FileNotFoundError:
            return None
        return tuple(out)

    def _outcome_in(self) -> Attempt | None:
        """The attempt whose outcome is complete, final and known without the job's state:
        rank 0's (or, without ``all_ranks``, any rank's: the others write one only when they
        raised), or every rank's of a fixed world with ``all_ranks``; None: not yet."""
        if not self.early:
            return None
        attempt, ranks = self._latest()
        if self.all_ranks:
            done = self.world is not None and len(ranks) >= self.world
        else:
            done = bool(ranks)
        return attempt if done else None

    def _settle(self, timeout: float | None) -> AppStatus | Attempt:
        """Block until the outcome is in (the attempt that wrote it) or the job ended (its
        final status)."""
        if self._final is not None:
            return self._final
        if not self.early:
            return self.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        # The folder is cheap to look at (one listdir); the scheduler less so (Slurm: squeue),
        # so it is asked every second or so, for a job that ends without an outcome.
        look_at, every = 0.0, 0.5
        while (attempt := self._outcome_in()) is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"{self.handle} has no outcome after {timeout:g} s")
            if now >= look_at:
                st = self._runner.status(self.handle)
                if isinstance(st, AppStatus) and st.is_terminal():
                    self._final = st
                    return st
                look_at, every = time.monotonic() + every, min(every * 1.5, 3.0)
            time.sleep(_FOLDER_POLL_S)
        return attempt

    def _complete(self, st: AppStatus, attempt: Attempt | None, ranks: list[int]) -> bool:
        """Whether the files hold all that a job which ended ``st`` leaves."""
        if st.state == AppState.SUCCEEDED:
            whole = not self.all_ranks or (attempt is not None and len(ranks) >= attempt.world)
            return 0 in ranks and whole
        if st.state == AppState.FAILED:
            return bool(ranks)
        return True  # cancelled, unknown: the workers were stopped, nothing is owed

    def _ended_outcome(
        self, settled: AppStatus | Attempt, timeout: float | None, deadline: float | None
    ) -> tuple[Attempt | None, list[int]]:
        """The outcomes that tell: those of the attempt whose outcome is in, or once the job
        ended ``settled``, the latest attempt's; short of what the job's end leaves, looked at
        again for up to OUTCOME_LAG_S where the folder may be seen late (NFS), never past the
        caller's ``deadline`` (then TimeoutError: the outcome is not known yet)."""
        if isinstance(settled, Attempt):
            return settled, outcome_ranks(attempt_dir(self.folder, settled))
        st = settled
        attempt, ranks = self._latest()
        if not self._may_lag or self._complete(st, attempt, ranks):
            return attempt, ranks
        if self._lag_until is None:
            self._lag_until = time.monotonic() + OUTCOME_LAG_S
        while (now := time.monotonic()) < self._lag_until:
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"{self.handle} ended {st.state.name}, its outcome not seen after "
                    f"{timeout:g} s (a network file system can show it late: ask again)"
                )
            until = self._lag_until if deadline is None else min(self._lag_until, deadline)
            time.sleep(min(_LAG_POLL_S, until - now))
            attempt, ranks = self._latest()
            if self._complete(st, attempt, ranks):
                break
        return attempt, ranks

    def _looked_again(self) -> str:
        return f"looked again for {OUTCOME_LAG_S:g} s; " if self._may_lag else ""

    def _conclude(
        self, timeout: float | None
    ) -> tuple[BaseException | None, Attempt | None, list[int]]:
        """(the call's exception or None, the attempt whose outcomes tell, their ranks)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        settled = self._settle(timeout)
        st = settled if isinstance(settled, AppStatus) else None  # None: the outcome is in
        attempt, ranks = self._ended_outcome(settled, timeout, deadline)
        for rank in sorted(ranks, key=lambda r: r != 0):
            out = self._outcome(attempt, rank)
            if out and out[0] == ERROR:
                _, exc, tb, r = out
                return _attach(exc, tb, f"raised in {self.handle} (rank {r})"), attempt, ranks
        if 0 in ranks and (st is None or st.state == AppState.SUCCEEDED):
            missing = self._missing(attempt, ranks)
            if missing:  # all_ranks: a list with a hole would put values at the wrong ranks
                exc = CallFailedError(
                    f"{self.handle}: the call succeeded, but rank(s) {missing} wrote no outcome "
                    f"({self._looked_again()}did the function end the process itself?)"
                )
                return exc, attempt, ranks
            return None, attempt, ranks
        if st is None:  # all_ranks' outcome in, yet no rank 0: cannot be; ask the scheduler
            st = self.wait(timeout)
        msg = f": {st.msg}" if st.msg else ""
        if st.state == AppState.SUCCEEDED:
            msg = (
                f", but rank 0 wrote no outcome ({self._looked_again()}did the function end the "
                "process itself?)"
            )
        return CallFailedError(f"{self.handle} ended {st.state.name}{msg}"), attempt, ranks

    def _missing(self, attempt: Attempt | None, ranks: list[int]) -> str:
        """With ``all_ranks``: the attempt's ranks without an outcome, as text ('' for none)."""
        if not self.all_ranks or attempt is None:
            return ""
        return ", ".join(str(r) for r in range(attempt.world) if r not in ranks)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until the outcome is in or the job ended; the call's exception (rank 0's
        first, else the first failed rank's), with the remote traceback attached; None when it
        succeeded. Only the latest attempt's outcomes count (a restart may leave an earlier
        one's behind). TimeoutError when it is not known after ``timeout`` s."""
        return self._conclude(timeout)[0]

    def result(self, timeout: float | None = None) -> R:
        """Block until the job ends; rank 0's return value (``all_ranks``: a list, one value
        per rank), or raise the call's exception (see :meth:`exception`)."""
        exc, attempt, ranks = self._conclude(timeout)
        if exc is not None:
            raise exc
        values = []
        for rank in ranks if self.all_ranks else [0]:
            out = self._outcome(attempt, rank)
            if out is None:  # removed since (by hand: the workers never remove one)
                raise CallFailedError(f"{self.handle}: the outcome of rank {rank} is gone")
            values.append(out[1])
        return values if self.all_ranks else values[0]  # type: ignore[return-value]

    def results(self) -> list[R]:
        """submitit's name: ``[result()]`` (every rank's values with ``all_ranks``)."""
        value = self.result()
        return value if self.all_ranks else [value]  # type: ignore[return-value]


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self._streams = streams

    def write(self, s: str) -> int:
        for stream in self._streams:
            stream.write(s)
        return len(s)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


class DebugJob(Generic[R]):
    """``scheduler="debug"``: the call runs in this process on the first ``result()``,
    ``exception()`` or ``wait()`` (submitit's debug executor), so a breakpoint or ``pdb``
    in the function works; its stdout is shown and kept for :meth:`stdout`."""

    handle = "debug://"
    folder = None

    def __init__(self, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._call: tuple[Callable[..., R], tuple[Any, ...], dict[str, Any]] | None = (
            fn,
            args,
            kwargs,
        )
        self._value: R | None = None
        self._exc: BaseException | None = None
        self._out = io.StringIO()
        self._state = AppState.PENDING
        self.job_id = f"debug-{id(self):x}"
        self.all_ranks = False

    def __repr__(self) -> str:
        return f"DebugJob({self.job_id!r})"

    def _run(self) -> None:
        if self._call is None:
            return
        fn, args, kwargs = self._call
        self._call = None
        self._state = AppState.RUNNING
        try:
            with contextlib.redirect_stdout(_Tee(sys.stdout, self._out)):
                self._value = fn(*args, **kwargs)
            self._state = AppState.SUCCEEDED
        except Exception as e:
            self._exc = _attach(e, traceback.format_exc(), "raised in debug mode")
            self._state = AppState.FAILED

    def status(self) -> AppState:
        return self._state

    def done(self) -> bool:
        return self._state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)

    def wait(self, timeout: float | None = None) -> AppStatus:
        self._run()
        return AppStatus(self._state)

    def cancel(self) -> None:
        if self._call is not None:
            self._call = None
            self._state = AppState.CANCELLED
            self._exc = CallFailedError(f"{self.job_id} ended CANCELLED")

    def stdout(self, rank: int = 0) -> str:
        return self._out.getvalue()

    def stderr(self, rank: int = 0) -> str:
        return ""

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._run()
        return self._exc

    def result(self, timeout: float | None = None) -> R:
        self._run()
        if self._exc is not None:
            raise self._exc
        return self._value  # type: ignore[return-value]

    def results(self) -> list[R]:
        return [self.result()]
