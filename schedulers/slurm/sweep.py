"""Slurm sweeps: ONE ``sbatch`` of a job array (see array.py), watched with ONE ``squeue``.

- submit: the array's script from :mod:`.array` through the scheduler's own dry run and
  ``schedule`` (workspace copy, sbatch); the sweep's handle is ``slurm://SESSION/<array job
  id>``, recorded in :mod:`xrun.sweeps.records` (and the trial table in
  ``slurm-logs/<id>/sweep.json``, next to the trials' logs).
- status: ``squeue -h -r -t all -j ID`` (``-r``: one line per task, pending ones too) is the
  only Slurm command, whatever the number of trials; then each trial's files, read only for
  trials that have a log dir: ``<trial>/<role>/<replica>.node`` (host; its mtime is the start),
  ``.exit`` (the exit code; its mtime is the end). A trial squeue no longer lists (after
  ``MinJobAge``) is judged by its exit files, or CANCELLED when it was cancelled before it
  ran.
- cancel: ``scancel ID`` (every trial) or ``scancel ID_TRIAL`` (one).
- logs: the trial's replica files, followed until ``squeue`` says the task has ended.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xrun.errors import SchedulerError, UsageError
from xrun.specs import AppState, is_terminal
from xrun.sweeps import records
from xrun.sweeps.backend import SweepBackend
from xrun.sweeps.plan import SweepPlan
from xrun.sweeps.records import check_trial
from xrun.sweeps.status import SweepStatus, TrialStatus
from xrun.tracker.submit import set_parent

from ..api import LogQuery, Scheduler
from ..logs import iter_log_lines
from ..workspace import Workspace
from .array import array_job, array_template
from .commands import run as _run
from .request import task_env
from .requeue import requeueing as _requeueing
from .status import SlurmJobRecord, app_state, expand_hostlist, explain

# %F: the array's job id, %K: the task's index, %A: its own job id (the array's, while pending).
SQUEUE_ARRAY_FORMAT = "%F|%K|%A|%T|%r|%N"
# While following a trial's logs, how often to ask Slurm whether it has ended.
FOLLOW_POLL_S = 0.5


def parse_array_squeue(text: str) -> dict[str, dict[int, SlurmJobRecord]]:
    """``squeue -h -r -o '%F|%K|%A|%T|%r|%N'`` -> array job id -> its tasks by index."""
    out: dict[str, dict[int, SlurmJobRecord]] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|", 5)]
        if len(fields) < 6 or not fields[1].isdigit():
            continue  # not an array task (%K is N/A)
        array, index, own, state, reason, nodes = fields
        out.setdefault(array, {})[int(index)] = SlurmJobRecord(
            job_id=own,
            app_id=f"{array}_{index}",
            state=state,
            reason=reason,
            nodelist=nodes,
        )
    return out


@dataclass
class _Replica:
    node: str = ""
    started: float | None = None
    code: int | None = None
    ended: float | None = None


def _read(path: str) -> tuple[str, float | None]:
    """(the file's first line, its mtime), ("", None) when it does not exist."""
    try:
        with open(path) as f:
            return f.readline().strip(), os.fstat(f.fileno()).st_mtime
    except OSError:
        return "", None


def _replicas(trial_dir: str, roles: Mapping[str, int]) -> list[_Replica]:
    out = []
    for role, n in roles.items():
        for k in range(n):
            base = os.path.join(trial_dir, role, str(k))
            node, started = _read(base + ".node")
            code, ended = _read(base + ".exit")
            value = int(code) if code.lstrip("-").isdigit() else None
            out.append(_Replica(node, started, value, ended if value is not None else None))
    return out


def trial_status(
    index: int,
    values: dict[str, str],
    rec: SlurmJobRecord | None,
    reps: list[_Replica],
    cancelled: bool,
    requeueing: bool,
) -> TrialStatus:
    """One trial from squeue's record (None: not listed) and its replicas' files."""
    codes = [r.code for r in reps]
    done = bool(reps) and all(c is not None for c in codes)
    code = next((c for c in codes if c not in (None, 0)), 0 if done else None)
    t = TrialStatus(index=index, values=values, exit_code=code)
    t.host = reps[0].node if reps and reps[0].node else ""
    starts = [r.started for r in reps if r.started is not None]
    t.started = min(starts) if starts else None
    t.ended = max(r.ended for r in reps if r.ended is not None) if done else None
    if rec is not None:
        t.app_id = rec.app_id
        t.host = t.host or next(iter(expand_hostlist(rec.nodelist)), "")
        t.state = app_state(rec.state)
        if t.state == AppState.FAILED:
            t.msg = explain(rec)
        if requeueing and t.state in (AppState.FAILED, AppState.SUCCEEDED):
            t.state, t.msg = AppState.PENDING, "requeued: " + t.msg
    elif done:
        t.state = AppState.SUCCEEDED if code == 0 else AppState.FAILED
    elif cancelled:
        t.state = AppState.CANCELLED
    else:
        t.state = AppState.UNKNOWN
        t.msg = "squeue no longer lists it and it recorded no exit code"
    if not is_terminal(t.state):
        t.ended = None
    return t


class ArrayBackend(SweepBackend):
    """A sweep as one Slurm job array (see the module doc)."""

    wait_poll_s = 2.0  # `xrun run --wait`: one squeue every 2 s (each answers for every task)

    def __init__(self, sched: Scheduler[Any]) -> None:
        super().__init__(sched)
        self.slurm: Any = sched  # a SlurmScheduler (not imported: it imports this module)

    def parallel(self, plan: SweepPlan) -> tuple[int | None, str]:
        if plan.max_parallel:
            return plan.max_parallel, f"--max-parallel: the array's %{plan.max_parallel}"
        return None, "Slurm starts array tasks as resources allow; --max-parallel K adds %K"

    def _request(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None
    ) -> Any:
        template = array_template(plan)
        # every task's tracker run is a child of the sweep's, whose id is the array's job id:
        # known to the task only (docs/tracking.md)
        set_parent([template], self.handle(task_env("SLURM_ARRAY_JOB_ID")))
        k, _ = self.parallel(plan)
        return self.slurm.array_dryrun(template, cfg, array_job(plan, template, k), workspace)

    def dryrun(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None = None
    ) -> str:
        return str(self._request(plan, cfg, workspace))

    def submit(
        self, plan: SweepPlan, cfg: Mapping[str, object], workspace: Workspace | None
    ) -> str:
        info = self._request(plan, cfg, workspace)
        try:
            job_id = str(self.slurm.schedule(info))
        except UsageError as e:
            if "array" not in str(e).lower():
                raise
            raise UsageError(
                f"{e}; a job array has at most MaxArraySize-1 tasks (`scontrol show config | "
                f"grep MaxArraySize`), this sweep has {len(plan)}: split it"
            ) from None
        k, why = self.parallel(plan)
        log_dir = os.path.join(info.request.log_root, job_id)
        spec = {
            "kind": "slurm-array",
            "scheduler": self.backend,
            "session": self.sched.session_name,
            "plan": plan.to_json(),
            "job_id": job_id,
            "log_dir": log_dir,
            "roles": dict(info.request.roles),
            "max_parallel": k,
            "parallel_why": why,
            "created": time.time(),
        }
        records.create(self.backend, job_id, spec, replace=True)
        os.makedirs(log_dir, exist_ok=True)
        records.write_json(os.path.join(log_dir, records.SPEC_FILE), spec)
        return job_id

    # ------------------------------------------------------------------ status
    def _squeue(self, job_ids: list[str]) -> tuple[dict[str, dict[int, SlurmJobRecord]], str]:
        """The arrays' tasks from ONE squeue call: (by array, "") or ({}, why squeue failed).
        With several ids squeue skips the ones it has forgotten; with one it says so."""
        argv = ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids)]
        proc = _run([*argv, "-o", SQUEUE_ARRAY_FORMAT])
        if proc.returncode == 0:
            return parse_array_squeue(proc.stdout), ""
        if "invalid job id" in proc.stderr.lower():  # slurmctld has forgotten the whole job
            return {}, ""
        return {}, f"squeue failed: {proc.stderr.strip()}"

    def status(self, sweep_id: str) -> SweepStatus | None:
        path = records.find(self.backend, sweep_id)
        if path is None:
            return None
        spec = _load_spec(path)
        recs, err = self._squeue([spec["job_id"]])
        return self._status(sweep_id, path, spec, recs.get(spec["job_id"], {}), err)

    def list(self) -> list[SweepStatus]:
        """This session's sweeps, from ONE squeue call for all of them."""
        found = []
        damaged = []
        for sweep_id in records.sweep_ids(self.backend):
            path = records.find(self.backend, sweep_id)
            spec = records.read_json(os.path.join(path, records.SPEC_FILE)) if path else None
            if path and spec and spec.get("session", "default") == self.sched.session_name:
                try:
                    found.append((sweep_id, path, _load_spec(path)))
                except records.DamagedRecord as e:  # `status` names it; the others still list
                    damaged.append(
                        SweepStatus(handle=self.handle(sweep_id), name="", params=[], msg=str(e))
                    )
        if not found:
            return damaged
        recs, err = self._squeue([spec["job_id"] for _, _, spec in found])
        return damaged + [
            self._status(sweep_id, path, spec, recs.get(spec["job_id"], {}), err)
            for sweep_id, path, spec in found
        ]

    def _status(
        self,
        sweep_id: str,
        path: str,
        spec: dict[str, Any],
        recs: dict[int, SlurmJobRecord],
        err: str,
    ) -> SweepStatus:
        plan, log_dir = spec["plan"], spec["log_dir"]
        roles = {str(k): int(v) for k, v in spec["roles"].items()}
        cancel_all, cancelled = records.cancel_requests(path)
        try:
            started = set(os.listdir(log_dir))
        except OSError:
            started = set()
        trials = []
        for i, values in enumerate(plan["trials"]):
            trial_dir = os.path.join(log_dir, str(i))
            reps = _replicas(trial_dir, roles) if str(i) in started else []
            requeueing = bool(reps) and _requeueing(trial_dir)
            rec = recs.get(i)
            t = trial_status(i, values, rec, reps, cancel_all or i in cancelled, requeueing)
            t.app_id = t.app_id or f"{spec['job_id']}_{i}"
            trials.append(t)
        return SweepStatus(
            handle=self.handle(sweep_id),
            name=plan["name"],
            params=list(plan["params"]),
            trials=trials,
            max_parallel=spec.get("max_parallel"),
            msg=err,
        )

    def cancel(self, sweep_id: str, trial: int | None) -> None:
        path = self.find(sweep_id)
        spec = _load_spec(path)
        if trial is not None:
            check_trial(sweep_id, trial, len(spec["plan"]["trials"]))
        records.request_cancel(path, trial)
        target = spec["job_id"] if trial is None else f"{spec['job_id']}_{trial}"
        proc = _run(["scancel", target])
        if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
            raise SchedulerError(f"`scancel {target}` failed: {proc.stderr.strip()}")

    # ------------------------------------------------------------------ logs
    def logs(self, sweep_id: str, trial: int, query: LogQuery) -> Iterable[str]:
        spec = _load_spec(self.find(sweep_id))
        check_trial(sweep_id, trial, len(spec["plan"]["trials"]))
        base = os.path.join(spec["log_dir"], str(trial), query.role, str(query.k))
        files = [f"{base}.{kind}" for kind in query.stream_names()]
        task = f"{spec['job_id']}_{trial}"

        def wait_done(timeout: float) -> bool:
            time.sleep(max(timeout, FOLLOW_POLL_S))
            proc = _run(["squeue", "-h", "-t", "all", "-j", task, "-o", "%T"])
            if proc.returncode != 0:
                return "invalid job id" in proc.stderr.lower()
            states = [app_state(s) for s in proc.stdout.split()]
            return not states or all(is_terminal(s) for s in states)

        done = wait_done if query.follow else (lambda _t: True)
        return query.filter(iter_log_lines(files, query.follow, done))

    def roles(self, sweep_id: str, trial: int) -> dict[str, int]:
        spec = _load_spec(self.find(sweep_id))
        check_trial(sweep_id, trial, len(spec["plan"]["trials"]))
        return {str(k): int(v) for k, v in spec["roles"].items()}


def _load_spec(path: str) -> dict[str, Any]:
    """``sweep.json`` with the job array's fields checked too (records.DamagedRecord)."""
    spec = records.load_spec(path)
    file = os.path.join(path, records.SPEC_FILE)
    records.check_fields(file, "", spec, {"job_id": (str,), "log_dir": (str,), "roles": (dict,)})
    if not all(type(v) is int for v in spec["roles"].values()):
        raise records.DamagedRecord(file, f"roles {spec['roles']!r:.40} are not counts")
    return spec
