"""Sweeps as trials that are normal apps: local_cwd, docker and any scheduler without its own.

``submit`` checks trial 0's request (bad input fails before anything runs), builds the
workspace once (docker: one image for every trial), records the sweep in
:mod:`xrun.sweeps.records` and starts the detached sweep supervisor
(:mod:`xrun.sweeps.supervisor`), then returns: the supervisor submits each trial as
an ordinary app of the scheduler (``<name>-<trial>``), at most K at once, and records what
becomes of it. So ``xrun status|log|cancel`` of a trial's own app work too, a failed trial does
not stop the others, and ``--max_retries`` (the agent's restarts, or the scheduler's) applies
to each trial as to any app.

K, unless ``--max-parallel`` says: what fits this machine (the trials of local_cwd and of the
local docker engine share it): its CPUs divided by the CPUs one trial asks for (the sum over
its replicas of ``resource.cpu``, at least 1 each), and likewise its visible GPUs when the
trials ask for GPUs; at least 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from xrun.config import current_dir
from xrun.procs import is_alive, proc_start_time, signal_if_same, visible_gpus
from xrun.schedulers.api import LogQuery, WorkspaceBuilder
from xrun.specs import AppDef, AppState, AppStatus
from xrun.sweeps import records
from xrun.sweeps.backend import SweepBackend, describe_parallel, make_sweep_id
from xrun.sweeps.plan import SweepPlan
from xrun.sweeps.records import check_trial
from xrun.sweeps.status import LIVE, SweepStatus, TrialStatus
from xrun.sweeps.supervisor import (
    SUPERVISOR_FILE,
    cancel_app,
    cancel_everything,
    initial_state,
    load_state,
    record,
    save_state,
    trial_app,
    unsettled,
)
from xrun.tracker.submit import set_parent

if TYPE_CHECKING:
    from xrun.schedulers.workspace import Workspace

SUPERVISOR_MODULE = "xrun.sweeps.supervisor"
# How long `cancel` waits for the supervisor to stop every trial and exit.
_CANCEL_WAIT_S = 120.0
# A supervisor that has not recorded its pid this long after submit is taken for dead.
_START_GRACE_S = 30.0


def machine_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_parallel(app: AppDef) -> tuple[int, str]:
    """(K, why): how many trials like ``app`` fit this machine at once (see the module doc)."""
    cpus = machine_cpus()
    per = sum(max(r.resource.cpu, 1) * r.num_replicas for r in app.roles)
    detail = " + ".join(f"{r.num_replicas} x {max(r.resource.cpu, 1)}" for r in app.roles)
    k = max(1, cpus // per)
    why = f"this machine has {cpus} CPU(s) and each trial asks for {per} ({detail})"
    gpus_per = sum(max(r.resource.gpu, 0) * r.num_replicas for r in app.roles)
    if gpus_per:
        gpus = len(visible_gpus())
        if gpus and gpus // gpus_per < k:
            k = max(1, gpus // gpus_per)
            why = f"this machine has {gpus} GPU(s) and each trial asks for {gpus_per}"
    return k, why + "; --max-parallel K to change"


class TrialsBackend(SweepBackend):
    """Each trial a normal app of ``sched``, started by a detached sweep supervisor."""

    def parallel(self, plan: SweepPlan) -> tuple[int | None, str]:
        if plan.max_parallel:
            return plan.max_parallel, "--max-parallel"
        return default_parallel(plan.app(0))

    def dryrun(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None = None
    ) -> str:
        k, why = self.parallel(plan)
        info = self.sched.submit_dryrun(trial_app(plan, 0), cfg, workspace)
        return (
            f"# {self.backend}: each trial is one app like trial 0's below (its own values "
            f"filled in), {describe_parallel(k, why)}, started by a detached sweep supervisor\n"
            f"{info}"
        )

    def submit(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None
    ) -> str:
        k, why = self.parallel(plan)
        # bad input, the workspace's included: before anything runs (or is built)
        info = self.sched.submit_dryrun(trial_app(plan, 0), cfg, workspace)
        if workspace is not None and isinstance(self.sched, WorkspaceBuilder):
            self._build_images(plan, self.sched, workspace, info.cfg)
        sweep_id = make_sweep_id(plan.name)
        # every trial's tracker run is a child of the sweep's (docs/tracking.md)
        set_parent([a for a in (plan.template, *(plan.apps or [])) if a], self.handle(sweep_id))
        spec = {
            "kind": "trials",
            "scheduler": self.backend,
            "session": self.sched.session_name,
            "plan": plan.to_json(),
            "cfg": dict(cfg),
            "cwd": current_dir(),
            "max_parallel": k,
            "parallel_why": why,
            "created": time.time(),
        }
        path = records.create(self.backend, sweep_id, spec)
        save_state(path, initial_state(len(plan)))
        _start_supervisor(path)
        return sweep_id

    @staticmethod
    def _build_images(
        plan: SweepPlan, builder: WorkspaceBuilder, workspace: Workspace, opts: Any
    ) -> None:
        """Build the workspace into each distinct image once, for every trial (docker): the
        trials' roles, each pointed at its image's build (in image order, as they are built)."""
        apps = [plan.template] if plan.template is not None else list(plan.apps or [])
        roles = sorted((r for a in apps if a is not None for r in a.roles), key=lambda r: r.image)
        builder.build_workspace(roles, workspace, opts)

    # ------------------------------------------------------------------ watching
    def status(self, sweep_id: str) -> SweepStatus | None:
        path = records.find(self.backend, sweep_id)
        if path is None:
            return None
        spec = records.load_spec(path)
        plan = spec["plan"]
        size = len(plan["trials"])
        # Liveness first, then the record: a supervisor found dead wrote its last record
        # before it exited, so the record read after is final. The other order could read the
        # record, lose the CPU while the supervisor wrote its last one and exited, then take it
        # for dead with the stale record: and write that back over the supervisor's below.
        alive = self._supervisor_alive(path)
        state = load_state(path, size) or initial_state(size)
        # The table and `xrun status SWEEP/TRIAL` read the same record: a trial that may still
        # change is what its app says now (the supervisor records it within POLL_S, or never
        # when it is gone), so the two cannot disagree.
        settled = [
            record(t, self.sched.describe(t["app_id"]), partial(records.first_end, path, i))
            for i, t in enumerate(state["trials"])
            if t["app_id"] and unsettled(t)
        ]
        if any(settled) and not alive:  # nobody else writes the record: keep what was learnt
            save_state(path, state)
        trials = [
            TrialStatus(
                index=i,
                values=plan["trials"][i],
                state=AppState[t["state"]],
                exit_code=t["exit_code"],
                host=t["host"],
                started=t["started"],
                ended=t["ended"],
                app_id=t["app_id"],
                msg=t["msg"],
            )
            for i, t in enumerate(state["trials"])
        ]
        st = SweepStatus(
            handle=self.handle(sweep_id),
            name=plan["name"],
            params=list(plan["params"]),
            trials=trials,
            max_parallel=spec.get("max_parallel"),
            msg=state.get("msg", ""),
        )
        if not st.is_terminal() and not alive:
            self._orphaned(path, st)
        return st

    def _supervisor_alive(self, path: str) -> bool:
        sup = records.load_supervisor(path)
        if sup is None:  # submit() is starting it right now
            age = time.time() - os.path.getmtime(os.path.join(path, records.SPEC_FILE))
            return age < _START_GRACE_S
        return is_alive(sup["pid"], sup["start"])

    def _orphaned(self, path: str, st: SweepStatus) -> None:
        """The supervisor died before the sweep ended: the trials with an app have been asked
        (see status); those without one never start."""
        for t in st.trials:
            if t.state in LIVE and not t.app_id:
                t.state = AppState.UNKNOWN
                t.msg = "never started: the sweep supervisor is gone"
        st.msg = (
            f"the sweep supervisor is gone (see {os.path.join(path, records.LOG_FILE)}); "
            "trials not started will not start; `xrun cancel` stops the running ones"
        )

    def trial_status(self, sweep_id: str, trial: int) -> AppStatus | None:
        """The trial's own app's status once it has one (every replica, restarts, errors);
        before that, what the sweep's table says."""
        t = self.trial(sweep_id, trial)
        if t is None:
            return None
        resp = self.sched.describe(t.app_id) if t.app_id else None
        return resp.app_status() if resp is not None else AppStatus(state=t.state, msg=t.msg)

    # ------------------------------------------------------------------ cancel
    def cancel(self, sweep_id: str, trial: int | None) -> None:
        path = self.find(sweep_id)
        size = len(records.load_spec(path)["plan"]["trials"])
        if trial is not None:
            check_trial(sweep_id, trial, size)
        records.request_cancel(path, trial)
        sup = records.load_supervisor(path)
        # Signalled only while it is the process recorded, never a later one that took its pid
        # (signal_if_same); not sent: gone (or never there).
        if trial is None:
            alive = sup is not None and signal_if_same(sup["pid"], sup["start"], signal.SIGTERM)
            if alive:  # it stops every trial, then exits
                assert sup is not None
                alive = not _wait_gone(sup["pid"], sup["start"], _CANCEL_WAIT_S)
            if not alive:  # gone (or never there): whatever it left running, stop it here
                cancel_everything(path, self.sched, load_state(path, size) or initial_state(size))
            return
        alive = sup is not None and is_alive(sup["pid"], sup["start"])
        state = load_state(path, size) or initial_state(size)
        t = state["trials"][trial]
        if alive:
            assert sup is not None
            if t["app_id"] and unsettled(t):
                self.sched.cancel(t["app_id"])  # the supervisor records how it ended
            if signal_if_same(sup["pid"], sup["start"], signal.SIGUSR1):  # read the requests now
                _wait_trial_ended(path, trial, size, timeout=15.0)
                return
            # It died meanwhile: what it recorded last, then record the trial here.
            state = load_state(path, size) or state
            t = state["trials"][trial]
        if unsettled(t):
            # Nobody else records it: ask its app how it ended (it may have ended on its own
            # since the supervisor died: not CANCELLED then), as the supervisor would.
            if t["app_id"]:
                ended = partial(records.first_end, path, trial)
                cancel_app(self.sched, t, ended, strict=True)
                if t["state"] == "CANCELLED":
                    t["msg"] = t["msg"] or "cancelled by request"
            else:
                t.update(state="CANCELLED", ended=time.time(), msg="cancelled by request")
            save_state(path, state)

    # ------------------------------------------------------------------ logs
    def logs(self, sweep_id: str, trial: int, query: LogQuery) -> Iterable[str]:
        path = self.find(sweep_id)
        size = len(records.load_spec(path)["plan"]["trials"])
        app_id = _trial_app_id(path, trial, size, wait=query.follow)
        if not app_id:
            return iter(())
        return self.sched.logs(app_id, query)


def _trial_app_id(path: str, trial: int, size: int, wait: bool) -> str:
    """The app of ``trial``; "" when it has none (yet: with ``wait``, until it has one or ends)."""
    while True:
        state = load_state(path, size)
        t = state["trials"][trial] if state else None
        if t is not None and t["app_id"]:
            return str(t["app_id"])
        if not wait or (t is not None and not unsettled(t)):
            return ""
        time.sleep(0.2)


def _wait_gone(pid: int, start: int | None, timeout: float) -> bool:
    """Whether the process ended within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while is_alive(pid, start):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_trial_ended(path: str, trial: int, size: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = load_state(path, size)
        if state and not unsettled(state["trials"][trial]):
            return
        time.sleep(0.05)


def _start_supervisor(path: str) -> None:
    """``python -m xrun.sweeps.supervisor PATH``, in a session of its own (it
    outlives ``xrun run``); its pid goes to ``supervisor.json`` for cancel and liveness."""
    log_fd = os.open(
        os.path.join(path, records.LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", SUPERVISOR_MODULE, path],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log_fd)
    # Not waited for (as docker's watcher): dropped while running, subprocess reaps it later.
    records.write_json(
        os.path.join(path, SUPERVISOR_FILE), {"pid": proc.pid, "start": proc_start_time(proc.pid)}
    )
