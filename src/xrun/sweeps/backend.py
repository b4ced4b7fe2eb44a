"""How a scheduler runs a sweep: the :class:`SweepBackend` interface, and which one it uses.

A scheduler that can run a whole sweep as one request of its own (Slurm: one job array) says
so with a ``sweep_backend()`` method returning its backend; every other scheduler (local_cwd,
docker, plugins) gets :class:`~xrun.sweeps.trials.TrialsBackend`: each trial a normal app,
at most K at once, started by a small detached sweep supervisor
(:meth:`xrun.runner.Runner.sweep_backend` picks).

A sweep is found by its handle ``SCHEDULER://SESSION/SWEEP_ID`` through
:mod:`xrun.sweeps.records`, where every backend records it at submit.
"""

from __future__ import annotations

import abc
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from xrun.errors import AppNotFoundError
from xrun.specs import AppStatus, make_app_handle
from xrun.sweeps import records
from xrun.sweeps.plan import SweepPlan
from xrun.sweeps.records import check_trial
from xrun.sweeps.status import SweepStatus, TrialStatus

if TYPE_CHECKING:  # types only: a backend is handed its scheduler, it never looks one up
    from xrun.schedulers.api import LogQuery, Scheduler
    from xrun.schedulers.workspace import Workspace

# How often wait() asks for the status of a running sweep.
WAIT_POLL_S = 0.5


class SweepBackend(abc.ABC):
    """A scheduler's way of running sweeps. ``sweep_id`` is the last part of the handle."""

    wait_poll_s = WAIT_POLL_S  # how often wait() asks for the status

    def __init__(self, sched: Scheduler[Any]) -> None:
        self.sched = sched

    @property
    def backend(self) -> str:
        return self.sched.backend

    def handle(self, sweep_id: str) -> str:
        return make_app_handle(self.backend, self.sched.session_name, sweep_id)

    # ---- submitting
    @abc.abstractmethod
    def dryrun(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None = None
    ) -> str:
        """What ``--dryrun`` prints after the trial table: the request(s) :meth:`submit` would
        make with the same ``workspace``, not executed."""

    @abc.abstractmethod
    def submit(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None
    ) -> str:
        """Start the sweep; returns its id at once (the trials go on without the caller)."""

    @abc.abstractmethod
    def parallel(self, plan: SweepPlan) -> tuple[int | None, str]:
        """(at most this many trials at once, None: no limit of ours; why, for the user)."""

    # ---- watching
    @abc.abstractmethod
    def status(self, sweep_id: str) -> SweepStatus | None:
        """Every trial's state; None when this user has no such sweep."""

    @abc.abstractmethod
    def cancel(self, sweep_id: str, trial: int | None) -> None:
        """End one trial (``trial``) or every trial (None): they end CANCELLED."""

    @abc.abstractmethod
    def logs(self, sweep_id: str, trial: int, query: LogQuery) -> Iterable[str]:
        """Trial ``trial``'s lines that ``query`` asks for (following: until the trial ends;
        a trial that has not started yet is waited for)."""

    def trial(self, sweep_id: str, trial: int) -> TrialStatus | None:
        """Trial ``trial``'s row of the sweep's table (state, its app's id once it has one);
        None when this user has no such sweep; UsageError for a trial the sweep lacks."""
        st = self.status(sweep_id)
        if st is None:
            return None
        check_trial(sweep_id, trial, len(st.trials))
        return st.trials[trial]

    def trial_status(self, sweep_id: str, trial: int) -> AppStatus | None:
        """Trial ``trial`` as an app: its status (``xrun status SWEEP/TRIAL``); None when this
        user has no such sweep. This default tells what the sweep's table tells."""
        t = self.trial(sweep_id, trial)
        return None if t is None else AppStatus(state=t.state, msg=t.msg)

    def wait(
        self,
        sweep_id: str,
        timeout: float | None = None,
        on_change: Callable[[SweepStatus], None] | None = None,
    ) -> SweepStatus | None:
        """Poll until every trial has ended (or ``timeout``); ``on_change`` sees each new
        count of trials by state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: object = None
        while True:
            st = self.status(sweep_id)
            if st is None:
                return None
            counts = st.counts()
            if on_change is not None and counts != last:
                on_change(st)
            last = counts
            if st.is_terminal() or (deadline is not None and time.monotonic() >= deadline):
                return st
            time.sleep(self.wait_poll_s)

    # ---- the record every backend keeps
    def find(self, sweep_id: str) -> str:
        path = records.find(self.backend, sweep_id)
        if path is None:
            raise AppNotFoundError(
                f"{self.backend} sweep {sweep_id!r} not found (no record in "
                f"{records.root()}); `xrun list -s {self.backend}` shows this user's sweeps"
            )
        return path

    def plan(self, sweep_id: str) -> SweepPlan:
        return SweepPlan.from_json(records.load_spec(self.find(sweep_id))["plan"])

    def roles(self, sweep_id: str, trial: int) -> dict[str, int]:
        """Trial ``trial``'s roles and their replica counts (for ``xrun log`` targets)."""
        plan = self.plan(sweep_id)
        check_trial(sweep_id, trial, len(plan))
        app = plan.app(trial)
        return {r.name: r.num_replicas for r in app.roles}

    def list(self) -> list[SweepStatus]:
        """This session's sweeps on this scheduler, oldest first."""
        out = []
        for sweep_id in records.sweep_ids(self.backend):
            path = records.find(self.backend, sweep_id)
            spec = records.read_json(os.path.join(path, records.SPEC_FILE)) if path else None
            if not spec or spec.get("session", "default") != self.sched.session_name:
                continue
            try:
                st = self.status(sweep_id)
            except records.DamagedRecord as e:  # `status` names it; the others still list
                st = SweepStatus(handle=self.handle(sweep_id), name="", params=[], msg=str(e))
            if st is not None:
                out.append(st)
        return out


def make_sweep_id(name: str) -> str:
    """``<name as a slug>-sweep-<8 random chars>``: readable, unique, safe as a dir name."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:30] or "sweep"
    n = int.from_bytes(os.urandom(6), "big")
    token = ""
    for _ in range(8):
        n, d = divmod(n, 36)
        token += "abcdefghijklmnopqrstuvwxyz0123456789"[d]
    return f"{slug}-sweep-{token}"


def describe_parallel(k: int | None, why: str) -> str:
    return f"at most {k} trial(s) at once ({why})" if k else f"no limit of xrun's ({why})"
