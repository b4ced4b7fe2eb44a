"""One resolver for every handle a command takes: an app, a sweep, or one trial of a sweep.

::

    SCHEDULER://SESSION/APP_ID[/ROLE[/REPLICA,...]]              an app (and a log target)
    SCHEDULER://SESSION/SWEEP_ID                                 a sweep
    SCHEDULER://SESSION/SWEEP_ID/TRIAL[/ROLE[/REPLICA,...]]      one of its trials

A handle names a sweep when this user's sweep records hold its id (one ``stat``, see
:mod:`xrun.sweeps.records`); anything else is an app, left to its scheduler to know or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrun.errors import UsageError
from xrun.specs import AppHandle
from xrun.sweeps import records

if TYPE_CHECKING:
    from xrun.schedulers.api import Scheduler
    from xrun.sweeps.backend import SweepBackend

FORMS = (
    "SCHEDULER://SESSION/APP_ID (e.g. local_cwd://default/ddp-x1y2z3), a sweep's "
    "SCHEDULER://SESSION/SWEEP_ID or one of its trials SCHEDULER://SESSION/SWEEP_ID/TRIAL"
)


class Target:
    """What a handle names. ``handle``: the app's or the sweep's own handle; ``trial``: the
    trial's index (a trial) or None; ``rest``: what follows (a log target's role, replicas).
    A plain class, not a dataclass: every command resolves one (benchmark 5 counts it)."""

    __slots__ = ("handle", "is_sweep", "rest", "trial")

    def __init__(
        self,
        handle: AppHandle,
        is_sweep: bool = False,
        trial: int | None = None,
        rest: tuple[str, ...] = (),
    ) -> None:
        self.handle, self.is_sweep, self.trial, self.rest = handle, is_sweep, trial, rest

    @property
    def kind(self) -> str:
        """ "app", "sweep" or "trial"."""
        if not self.is_sweep:
            return "app"
        return "sweep" if self.trial is None else "trial"

    def __str__(self) -> str:
        return f"{self.handle}/{self.trial}" if self.trial is not None else str(self.handle)


def resolve(text: str, max_rest: int = 0) -> Target:
    """``text`` as a :class:`Target`; at most ``max_rest`` parts may follow the app or trial
    (``xrun log``: 2, ROLE and REPLICAS; the other commands: none). UsageError otherwise."""
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
        return Target(handle, rest=tuple(rest))
    if not rest:
        return Target(handle, is_sweep=True)
    if not rest[0].isdigit() or not rest[0].isascii():
        raise UsageError(
            f"{text!r}: {rest[0]!r} is not a trial number; expected {FORMS} "
            f"(`xrun status {handle}` lists the trials)"
        )
    _check_rest(text, rest[1:], max_rest, "a trial")
    return Target(handle, is_sweep=True, trial=int(rest[0]), rest=tuple(rest[1:]))


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
