"""One resolver for every handle a command takes: an app, a sweep, or one trial of a sweep.

::

    SCHEDULER://SESSION/APP_ID[/ROLE[/REPLICA,...]]              an app (and a log target)
    SCHEDULER://SESSION/SWEEP_ID                                 a sweep
    SCHEDULER://SESSION/SWEEP_ID/TRIAL[/ROLE[/REPLICA,...]]      one of its trials

A handle names a sweep when this user's sweep records hold its id (one ``stat``, see
:mod:`xrun.sweeps.records`); anything else is an app, left to its scheduler to know or not.

:func:`resolve` returns a :class:`Target` that has the verbs (``status``, ``wait``,
``describe``, ``logs``, ``roles``, ``cancel``, ``stacks``): an :class:`AppTarget` asks its
scheduler, a :class:`SweepTarget` and a :class:`TrialTarget` the scheduler's sweep backend. So
the Runner and the commands call the verb and never ask what kind of handle they hold (as
TorchX's ``Runner`` calls the held scheduler's verbs). A verb that does not apply (a sweep's
logs) is a one-line UsageError.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from xrun.errors import AppNotFoundError, UsageError
from xrun.specs import AppDef, AppHandle, AppStatus
from xrun.sweeps import records

if TYPE_CHECKING:
    from xrun.schedulers.api import DescribeAppResponse, LogQuery, Scheduler
    from xrun.schedulers.stacks import AppStacks
    from xrun.sweeps.backend import SweepBackend
    from xrun.sweeps.plan import SweepPlan
    from xrun.sweeps.status import SweepStatus

FORMS = (
    "SCHEDULER://SESSION/APP_ID (e.g. local_cwd://default/ddp-x1y2z3), a sweep's "
    "SCHEDULER://SESSION/SWEEP_ID or one of its trials SCHEDULER://SESSION/SWEEP_ID/TRIAL"
)

# (scheduler name, session) -> that scheduler: the Runner's cache (``Runner.scheduler``).
SchedulerOf = Callable[[str, str], "Scheduler[Any]"]
# What ``xrun log`` prints of a target, one entry per app: (its handle, what to call it in an
# error, its roles: name -> replica count, its lines' label prefix: a sweep's names the trial).
LogPart = tuple[str, str, dict[str, int], str]


class Target(abc.ABC):
    """What a handle names, with the verbs. ``handle``: the app's or the sweep's own handle;
    ``rest``: what follows (a log target's role, replicas). The scheduler is looked up on the
    first verb, not at resolve time: a malformed option is still told before an unknown
    scheduler. Plain classes, not dataclasses: every command resolves one (benchmark 5)."""

    __slots__ = ("_scheduler_of", "handle", "rest")
    sortable = False  # status() is a table of trials that ``xrun status --sort`` orders

    def __init__(self, handle: AppHandle, scheduler_of: SchedulerOf, rest: tuple[str, ...]) -> None:
        self.handle, self._scheduler_of, self.rest = handle, scheduler_of, rest

    @property
    def sched(self) -> Scheduler[Any]:
        return self._scheduler_of(self.handle.scheduler, self.handle.session)

    def __str__(self) -> str:
        return str(self.handle)

    def what(self) -> str:
        """The target in a sentence: ``xrun: cancelled {what()}``."""
        return str(self)

    @abc.abstractmethod
    def status(self) -> AppStatus | SweepStatus | None:
        """The app's (or trial's) status; a sweep's: every trial's. None when unknown."""

    @abc.abstractmethod
    def wait(self, wait_interval: float, timeout: float | None) -> AppStatus | SweepStatus | None:
        """Block until it ends (or ``timeout`` seconds pass); None when unknown."""

    @abc.abstractmethod
    def describe(self) -> AppDef | None:
        """The AppDef (a sweep's: its template); None when unknown."""

    @abc.abstractmethod
    def logs(self, query: LogQuery) -> Iterable[str]:
        """The lines ``query`` asks for."""

    def roles(self) -> dict[str, int] | None:
        """The roles and their replica counts (``xrun log`` targets); None when unknown."""
        app = self.describe()
        return None if app is None else {r.name: r.num_replicas for r in app.roles}

    def cancel(self, missing_ok: bool) -> None:
        """Stop it (it ends CANCELLED); an unknown handle does nothing unless not
        ``missing_ok`` (AppNotFoundError)."""
        try:
            self._cancel()
        except AppNotFoundError:
            if not missing_ok:
                raise

    @abc.abstractmethod
    def _cancel(self) -> None: ...

    @abc.abstractmethod
    def stacks(self, timeout: float) -> AppStacks:
        """Every rank's Python stack of the running app, read by each node's agent."""

    @abc.abstractmethod
    def log_parts(self, follow: bool) -> tuple[list[LogPart], list[str]] | None:
        """What ``xrun log`` prints (see :data:`LogPart`) and the notes it says first (a
        trial that has not run; only when not ``follow``ing); None when unknown."""


class AppTarget(Target):
    """An app: every verb is its scheduler's."""

    __slots__ = ()

    def status(self) -> AppStatus | None:
        return _app_status(self.sched.describe(self.handle.app_id))

    def wait(self, wait_interval: float, timeout: float | None) -> AppStatus | None:
        # the scheduler is told when the app ends (local_cwd: a pidfd) or polls on its own
        return _app_status(self.sched.wait(self.handle.app_id, timeout))

    def describe(self) -> AppDef | None:
        resp = self.sched.describe(self.handle.app_id)
        return None if resp is None else AppDef(name=self.handle.app_id, roles=list(resp.roles))

    def logs(self, query: LogQuery) -> Iterable[str]:
        return self.sched.logs(self.handle.app_id, query)

    def _cancel(self) -> None:
        self.sched.cancel(self.handle.app_id)

    def stacks(self, timeout: float) -> AppStacks:
        from xrun.schedulers.stacks import AppStacks  # benchmark 5: no dry run loads it

        return AppStacks.of(self.handle.app_id, self.sched.stacks(self.handle.app_id, timeout))

    def log_parts(self, follow: bool) -> tuple[list[LogPart], list[str]] | None:
        roles = self.roles()
        return None if roles is None else ([(str(self), f"app {self}", roles, "")], [])


class _OfSweep(Target):
    """A sweep or one of its trials: the verbs are the scheduler's sweep backend's."""

    __slots__ = ()

    @property
    def backend(self) -> SweepBackend:
        return backend_for(self.sched)

    @property
    def sweep_id(self) -> str:
        return self.handle.app_id

    def _plan(self) -> SweepPlan | None:
        backend = self.backend
        return None if backend.status(self.sweep_id) is None else backend.plan(self.sweep_id)


class SweepTarget(_OfSweep):
    """A sweep: its status is a table of its trials; cancel stops every trial."""

    __slots__ = ()
    sortable = True

    def what(self) -> str:
        return f"every trial of {self}"

    def status(self) -> SweepStatus | None:
        return self.backend.status(self.sweep_id)

    def wait(self, wait_interval: float, timeout: float | None) -> SweepStatus | None:
        return self.backend.wait(self.sweep_id, timeout)

    def describe(self) -> AppDef | None:
        """The template AppDef (``{{NAME}}`` placeholders; trial 0's when each trial differs)."""
        plan = self._plan()
        if plan is None:
            return None
        return plan.template if plan.template is not None else plan.app(0)

    def logs(self, query: LogQuery) -> Iterable[str]:
        raise UsageError(
            f"{self} is a sweep: its logs are its trials', name one as {self}/TRIAL "
            "(`xrun log SWEEP` prints every trial's)"
        )

    def _cancel(self) -> None:
        self.backend.cancel(self.sweep_id, None)

    def stacks(self, timeout: float) -> AppStacks:
        raise UsageError(
            f"{self} is a sweep: name one of its trials, {self}/TRIAL (`xrun status` lists them)"
        )

    def log_parts(self, follow: bool) -> tuple[list[LogPart], list[str]] | None:
        """Every replica of every trial, labelled ``TRIAL/role/replica`` (trials that never ran
        have no lines; ``-f`` waits for them)."""
        backend = self.backend
        st = backend.status(self.sweep_id)
        if st is None:
            return None
        parts: list[LogPart] = []
        for i in range(len(st.trials)):
            handle = f"{self.handle}/{i}"
            parts.append((handle, f"trial {handle}", backend.roles(self.sweep_id, i), f"{i}/"))
        waiting = [t for t in st.trials if t.started is None]
        if follow or not waiting:
            return parts, []
        return parts, [f"{len(waiting)} trial(s) of {self} have not run; -f waits for them"]


class TrialTarget(_OfSweep):
    """One trial of a sweep: an app of the sweep's scheduler, asked through the sweep."""

    __slots__ = ("trial",)

    def __init__(
        self, handle: AppHandle, scheduler_of: SchedulerOf, trial: int, rest: tuple[str, ...]
    ) -> None:
        super().__init__(handle, scheduler_of, rest)
        self.trial = trial

    def __str__(self) -> str:
        return f"{self.handle}/{self.trial}"

    def what(self) -> str:
        return f"trial {self.trial} of {self.handle}"

    def status(self) -> AppStatus | None:
        return self.backend.trial_status(self.sweep_id, self.trial)

    def wait(self, wait_interval: float, timeout: float | None) -> AppStatus | None:
        """Polls the trial at most every ``wait_interval`` s (the backend's pace if faster)."""
        backend = self.backend
        deadline = None if timeout is None else time.monotonic() + timeout
        poll = max(0.0, min(wait_interval, backend.wait_poll_s))
        while True:
            st = backend.trial_status(self.sweep_id, self.trial)
            if st is None or st.is_terminal():
                return st
            if deadline is not None and time.monotonic() >= deadline:
                return st
            time.sleep(poll)

    def describe(self) -> AppDef | None:
        plan = self._plan()
        if plan is None:
            return None
        records.check_trial(self.sweep_id, self.trial, len(plan))
        return plan.app(self.trial)

    def logs(self, query: LogQuery) -> Iterable[str]:
        return self.backend.logs(self.sweep_id, self.trial, query)

    def roles(self) -> dict[str, int] | None:
        return self.backend.roles(self.sweep_id, self.trial)

    def _cancel(self) -> None:
        self.backend.cancel(self.sweep_id, self.trial)

    def stacks(self, timeout: float) -> AppStacks:
        """The trial's own app's (Slurm: its array task's)."""
        from xrun.schedulers.stacks import AppStacks  # benchmark 5: no dry run loads it

        backend = self.backend
        row = backend.trial(self.sweep_id, self.trial)
        if row is None:
            raise AppNotFoundError(f"sweep {self.handle} not found")
        if not row.app_id:
            raise UsageError(f"trial {self.trial} of {self.handle} has not started; no stacks yet")
        return AppStacks.of(row.app_id, backend.sched.stacks(row.app_id, timeout))

    def log_parts(self, follow: bool) -> tuple[list[LogPart], list[str]] | None:
        roles = self.roles()
        if roles is None:
            return None
        return [(str(self), f"trial {self}", roles, "")], ([] if follow else self._not_run())

    def _not_run(self) -> list[str]:
        from xrun.sweeps.status import LIVE

        t = self.backend.trial(self.sweep_id, self.trial)
        if t is None or t.started is not None:
            return []
        how = "; -f waits for it" if t.state in LIVE else ""
        return [f"trial {self.trial} of {self.handle} has not run ({t.state.name}){how}"]


def resolve(text: str, scheduler_of: SchedulerOf, max_rest: int = 0) -> Target:
    """``text`` as a :class:`Target` whose verbs ask ``scheduler_of(name, session)``; at most
    ``max_rest`` parts may follow the app or trial (``xrun log``: 2, ROLE and REPLICAS; the
    other commands: none). UsageError otherwise."""
    scheme, sep, tail = text.strip().partition("://")
    parts = tail.split("/")
    if not sep or len(parts) < 2:
        raise _malformed(text, max_rest)
    try:
        handle = AppHandle.parse(f"{scheme}://{parts[0]}/{parts[1]}")
    except UsageError:
        raise _malformed(text, max_rest) from None
    rest = parts[2:]
    while max_rest and rest and not rest[-1]:  # a log target's trailing slash: no more
        rest.pop()
    if records.find(handle.scheduler, handle.app_id) is None:
        _check_rest(text, rest, max_rest, "the app")
        return AppTarget(handle, scheduler_of, tuple(rest))
    if not rest:
        return SweepTarget(handle, scheduler_of, ())
    if not rest[0].isdigit() or not rest[0].isascii():
        raise UsageError(
            f"{text!r}: {rest[0]!r} is not a trial number; expected {FORMS} "
            f"(`xrun status {handle}` lists the trials)"
        )
    _check_rest(text, rest[1:], max_rest, "a trial")
    return TrialTarget(handle, scheduler_of, int(rest[0]), tuple(rest[1:]))


def _check_rest(text: str, rest: list[str], max_rest: int, what: str) -> None:
    if len(rest) > max_rest:
        if max_rest == 0 and what == "the app":
            raise _malformed(text, max_rest)
        extra = "/".join(rest)
        where = "" if max_rest == 0 else " (at most ROLE/REPLICA,...)"
        raise UsageError(f"{text!r}: nothing may follow {what} here, got {extra!r}{where}")


def _malformed(text: str, max_rest: int) -> UsageError:
    more = "[/ROLE[/REPLICA[,REPLICA...]]]" if max_rest else ""
    return UsageError(f"malformed app handle {text!r}; expected {FORMS}{more}")


def backend_for(sched: Scheduler[Any]) -> SweepBackend:
    """How ``sched`` runs sweeps: its own way (:meth:`Scheduler.sweep_backend`: Slurm's one job
    array), else every trial an ordinary app of ``sched`` (:class:`~xrun.sweeps.trials.TrialsBackend`)."""
    # benchmark 5: resolving a handle (every command) must not load the trials' supervisor
    from xrun.sweeps.trials import TrialsBackend

    return sched.sweep_backend() or TrialsBackend(sched)


def _app_status(resp: DescribeAppResponse | None) -> AppStatus | None:
    return None if resp is None else resp.app_status()
