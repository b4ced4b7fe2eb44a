"""The ``slurm`` scheduler: one ``sbatch`` per app, every replica one Slurm task.

``submit_dryrun`` builds a :class:`~xrun.schedulers.slurm.request.SlurmBatchRequest` (the whole
batch script; see that module for the layout of a job), ``schedule`` pipes it to
``sbatch --parsable``. Everything after that works from any shell on the cluster:

- status: ``squeue --json`` where the installed Slurm has it (probed once), else the text
  form; then ``scontrol show job`` (finished jobs until ``MinJobAge``); then ``sacct`` (with
  accounting) or ``sacct -c`` (a jobcomp file). Nothing needs accounting.
- logs: the replica files under ``<chdir>/slurm-logs/<jobid>/``; the location is recorded in a
  state file (``$XDG_STATE_HOME/xrun/slurm/<jobid>.json``) and, for other users or machines,
  is also read back from the job's ``StdOut`` path.
- list: the jobs whose comment starts with ``xrun:`` (``xrun:APP;ROLE=N;...``: the roles and
  replica counts, so that any shell finds each replica's logs).

Retries and preemption: a role's ``max_retries`` N means N+1 attempts in all, with one owner.
A ``dist.*`` role's runtime agents restart its workers in place (``--max-restarts N``, the fast
path torchrun users expect), so the batch script does not requeue it after a failure; any
other role (``utils.sh``, a TorchX torchrun AppDef) is requeued after a failure up to N times.
After the ``signal`` warning (preemption or time limit; default ``USR2@90``: passed to srun, to
each replica's agent, to its workers) every job is requeued up to N times. As TorchX, a job of
several roles takes the *smallest* of their ``max_retries``. A requeue is ``scontrol requeue``:
same job id, ``SLURM_RESTART_COUNT`` counts attempts. Slurm holds a requeued job ~120 s
(Reason BeginTime) before it runs again; status says PENDING with that reason meanwhile.

Signals, the grace period and exit codes (tests/schedulers/slurm/test_signals.py): ``cancel`` is
``scancel JOBID``. slurmd sends SIGCONT and SIGTERM to every process of the job's steps (its
process-tracking container: the batch shell, srun, each replica's ``xrun_replica`` wrapper,
the runtime agent *and its workers*: a worker gets SIGTERM from slurmstepd as well as from its
agent, measured on 22.05 with proctrack/linuxproc), then SIGKILL to whatever is left
``KillWait`` seconds later (slurm.conf; Slurm's default 30 s, the test cluster's 5 s;
``scontrol show config | grep KillWait``). The ``dist.ddp`` agent SIGKILLs the workers
still alive after its shutdown timeout (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` in the role's env,
default 30 s) and exits 143. A worker's grace period is therefore
``min(agent shutdown timeout, KillWait)``.

- While the processes end, Slurm shows the job COMPLETING: status says RUNNING with the message
  ``COMPLETING signal=15``. Once every process has ended the job is CANCELLED (message
  ``CANCELLED signal=15``; Slurm's ExitCode ``0:15``); ``xrun run --wait`` then exits 1.
- Each replica ``xrun status`` shows reads CANCELLED, whatever its exit code: 143 (its agent
  exited by itself: the workers obeyed, or the shutdown timeout came first), 1 (a dist.ddp
  agent that saw a peer close the rendezvous before its own SIGTERM) or none at all: a SIGKILL
  also ended the wrapper that records the code (slurmd's, when KillWait came first, or srun's
  ``--kill-on-bad-exit`` after a peer exited non-zero). A replica that had already exited 0
  stays SUCCEEDED.
- A SIGTERM to the tasks that is not a cancel (``scancel --signal=TERM JOBID``, a site's drain
  script) leaves the job to end by itself: the agents forward it and exit 143, the batch
  script exits with srun's code (its tasks' highest) and the app ends FAILED
  (``exit_code=143``), every replica FAILED with 143 (or 1 or none, as above); with
  ``max_retries`` left, the batch script requeues the job instead.

``python3`` in the tasks: the batch script puts the submitting interpreter's bin dir first on
``PATH`` (run option ``python_path``), as local_cwd does; that suits clusters whose nodes share
the login node's filesystem. Set ``python_path=`` (empty) to keep the nodes' own ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xrun import xdg
from xrun.config import current_dir
from xrun.contract import SCRIPT
from xrun.errors import AppNotFoundError, SchedulerError, UsageError
from xrun.specs import (
    AppDef,
    AppState,
    ReplicaStatus,
    Role,
    RoleStatus,
    appdef_from_dict,
    appdef_to_dict,
    is_terminal,
)

from ..api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    LogQuery,
    Scheduler,
    runopts,
)
from ..logs import iter_log_lines, root_cause_in
from ..workspace import Workspace, as_workspace, check_scripts, open_workspace, script_rel
from .commands import NOT_FOUND
from .commands import run as _run
from .losses import LOST
from .options import SlurmOptions
from .request import (
    LOG_SUBDIR,
    ArrayJob,
    ClusterInfo,
    SlurmBatchRequest,
    build_request,
    parse_comment,
)
from .requeue import requeueing as _requeueing
from .status import (
    SACCT_COMP_FIELDS,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmJobRecord,
    app_records,
    app_state,
    expand_hostlist,
    explain,
    fold_state,
    parse_sacct,
    parse_scontrol,
    parse_squeue_json,
    parse_squeue_text,
    preemptions,
)

if TYPE_CHECKING:
    from ..stacks import NodeStacks

# While following logs, how often to ask Slurm whether the job has ended.
FOLLOW_POLL_S = 0.5


def state_dir() -> str:
    """Where submitted jobs are recorded: ``$XDG_STATE_HOME/xrun/slurm`` (~/.local/state/...)."""
    return xdg.state_dir("slurm")


def parse_version(text: str) -> tuple[int, int]:
    """``slurm 23.11.4`` / ``slurm-wlm 22.05.8`` -> (23, 11); unknown -> (0, 0)."""
    m = re.search(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _check_scripts(app: AppDef, chdir: str, workspace: Workspace | None) -> None:
    """Each role's ``--script`` is a file where the job will find it (N11: it would otherwise
    only fail as the app, on the cluster): in the workspace that is copied to job_dir, or in
    the folder the job runs in."""
    if workspace is not None:
        check_scripts(
            app, workspace, f"the job runs in its copy in job_dir {chdir}", "on the nodes"
        )
        return
    for role in app.roles:
        script = (role.metadata or {}).get(SCRIPT)
        rel = script_rel(script)
        if rel is not None and not os.path.isfile(os.path.join(chdir, rel)):
            raise UsageError(
                f"role {role.name!r}: --script {script!r} is no file in {chdir} (without "
                "-cfg job_dir the job runs in the workspace itself); give a script inside "
                "it, or an absolute path"
            )


def _chdir_and_copy(cfg: SlurmOptions, workspace: Workspace | None) -> tuple[str, Workspace | None]:
    """Where the job runs, and the workspace schedule copies there first (job_dir only; the
    cwd when none is given, as the job runs in the cwd without job_dir)."""
    if cfg.job_dir:
        return os.path.abspath(cfg.job_dir), workspace or open_workspace(current_dir())
    if workspace is None:
        return os.path.abspath(current_dir()), None
    local = workspace.local_path()
    if local is None:
        raise UsageError(
            f"workspace {workspace.given or workspace.url!r} is not a local folder, so the job "
            "cannot run in it: add -cfg job_dir=DIR (a new folder the nodes share; the "
            "workspace is copied there)"
        )
    return local, None


class SlurmScheduler(Scheduler[SlurmBatchRequest]):
    backend = "slurm"

    def __init__(self, session_name: str) -> None:
        super().__init__(session_name)
        self._info: dict[str, ClusterInfo] = {}
        self._json_ok: bool | None = None

    # ------------------------------------------------------------------ options
    def run_opts(self) -> runopts[SlurmOptions]:
        return runopts(SlurmOptions)

    # ------------------------------------------------------------------ cluster facts
    def cluster_info(self, partition: str | None, required: bool) -> ClusterInfo:
        """Version and node memory, asked once per partition; defaults when Slurm is absent
        and not ``required`` (a dry run on a laptop)."""
        key = partition or ""
        if key in self._info:
            return self._info[key]
        if shutil.which("sbatch") is None:
            if required:
                raise UsageError(NOT_FOUND.format(cmd="sbatch"))
            return ClusterInfo()
        version = parse_version(_run(["sbatch", "--version"]).stdout)
        argv = ["sinfo", "-h", "-o", "%m"] + (["-p", partition] if partition else [])
        mems = []
        try:
            out = _run(argv).stdout
            mems = [int(m) for m in re.findall(r"\d+", out)]
        except (UsageError, SchedulerError):  # no sinfo, or no answer: node memory is optional
            pass
        info = ClusterInfo(version=version, node_mem_mb=min(mems) if mems else None)
        self._info[key] = info
        return info

    # ------------------------------------------------------------------ submit
    def open_workspace(self, given: Workspace | str | None) -> Workspace | None:
        """The folder the job runs in (without ``job_dir``: a local one), or that schedule
        copies to ``job_dir``; None: the cwd. Opened before the dry run, so ``--dryrun``
        shows the very folder and ignore set that schedule copies, and a workspace that is no
        folder fails the dry run as it would fail submit."""
        return as_workspace(given)

    def _submit_dryrun(
        self, app: AppDef, cfg: SlurmOptions, workspace: Workspace | None = None
    ) -> AppDryRunInfo[SlurmBatchRequest]:
        return self._request(app, cfg, workspace, None)

    def _request(
        self, app: AppDef, cfg: SlurmOptions, workspace: Workspace | None, array: ArrayJob | None
    ) -> AppDryRunInfo[SlurmBatchRequest]:
        chdir, copied = _chdir_and_copy(cfg, workspace)
        _check_scripts(app, chdir, copied)
        python_path = cfg.python_path
        if python_path is None:
            python_path = os.path.dirname(sys.executable)
        info = self.cluster_info(cfg.partition or None, required=False)
        req = build_request(
            app,
            cfg,
            chdir=chdir,
            info=info,
            path_prefix=python_path or None,
            workspace=copied,
            array=array,
        )
        return AppDryRunInfo(req, lambda r: r.materialize())

    # ------------------------------------------------------------------ sweeps
    def sweep_backend(self) -> Any:
        """A sweep is ONE job array here (see sweep.py), not one job per trial."""
        from .sweep import ArrayBackend

        return ArrayBackend(self)

    def array_dryrun(
        self,
        app: AppDef,
        cfg: Mapping[str, object],
        array: ArrayJob,
        workspace: Workspace | str | None,
    ) -> AppDryRunInfo[SlurmBatchRequest]:
        """The request for ``app`` as the job array ``array`` (one task per sweep trial)."""
        ws = self.open_workspace(workspace)
        opts = self._checked(app, cfg)
        return self._stamped(self._request(app, opts, ws, array), app, opts)

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        req = dryrun_info.request
        if shutil.which("sbatch") is None:
            raise UsageError(NOT_FOUND.format(cmd="sbatch"))
        if req.workspace:
            from .workspace import copy_workspace

            copy_workspace(req.workspace, req.chdir)
        os.makedirs(req.log_root, exist_ok=True)
        proc = _run(req.sbatch_argv, stdin=req.script)
        if proc.returncode != 0:
            said = "; ".join(ln.strip() for ln in proc.stderr.splitlines() if ln.strip())
            raise UsageError(
                f"`{' '.join(req.sbatch_argv)}` rejected the job (exit {proc.returncode}): "
                f"{said or proc.stdout.strip()} (xrun run --dryrun prints the script it was given)"
            )
        job_id = proc.stdout.strip().split(";")[0]  # --parsable: ID or ID;CLUSTER
        if not job_id.isdigit():
            # A handle without a job id would name nothing that status or cancel can find.
            raise SchedulerError(
                f"`{' '.join(req.sbatch_argv)}` exited 0 but printed no job id "
                f"(stdout {proc.stdout.strip()!r}); check `squeue --me` before "
                f"submitting again"
            )
        self._record(job_id, req, dryrun_info.app)
        return job_id

    def _record(self, job_id: str, req: SlurmBatchRequest, app: AppDef | None) -> None:
        os.makedirs(state_dir(), exist_ok=True)
        path = os.path.join(state_dir(), f"{job_id}.json")
        data = {
            "app_name": req.app_name,
            "log_dir": os.path.join(req.log_root, job_id),
            "roles": req.roles,
            "session": self.session_name,
            "app": appdef_to_dict(app) if app is not None else None,
        }
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    def _recorded(self, job_id: str) -> dict[str, Any]:
        try:
            with open(os.path.join(state_dir(), f"{job_id}.json")) as f:
                data: dict[str, Any] = json.load(f)
                return data
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------------ status
    def _squeue_records(self, app_id: str | None = None) -> list[SlurmJobRecord] | None:
        """This user's jobs (JSON when this Slurm has it), None when squeue fails.

        ``-j``/``--me`` keep the answer small; 22.05's JSON ignores them, so callers filter.
        """
        select = ["-j", app_id] if app_id else ["--me"]
        if self._json_ok is not False:
            proc = _run(["squeue", "--json", *select])
            if _gone(proc):
                return []
            if proc.returncode == 0:
                try:
                    records = parse_squeue_json(proc.stdout)
                    self._json_ok = True
                    return records
                except ValueError:
                    pass
            # No openapi/data_parser plugin here: use the text form from now on.
            self._json_ok = False
        proc = _run(["squeue", "-h", "-t", "all", *select, "-o", SQUEUE_FORMAT])
        if _gone(proc):
            return []
        return parse_squeue_text(proc.stdout) if proc.returncode == 0 else None

    def _records(self, app_id: str) -> list[SlurmJobRecord]:
        if not re.fullmatch(r"\d+", app_id):
            raise AppNotFoundError(f"{app_id!r} is not a Slurm job id (expected digits, e.g. 1234)")
        recs = app_records(self._squeue_records(app_id) or [], app_id)
        if not recs or any(r.exit_code is None and is_terminal(app_state(r.state)) for r in recs):
            # scontrol has exit codes and restarts, which the text squeue lacks.
            proc = _run(["scontrol", "show", "job", "-o", app_id])
            if proc.returncode == 0:
                recs = app_records(parse_scontrol(proc.stdout), app_id) or recs
        if not recs:
            recs = self._sacct(app_id)
        return recs

    def _sacct(self, app_id: str) -> list[SlurmJobRecord]:
        """The job after it left squeue/scontrol: accounting, else the jobcomp file."""
        for argv, fields in (
            (
                ["sacct", "-X", "-j", app_id, "--parsable2", "--noheader", "-o", SACCT_FIELDS],
                SACCT_FIELDS,
            ),
            (
                ["sacct", "-c", "-j", app_id, "--parsable2", "--noheader", "-o", SACCT_COMP_FIELDS],
                SACCT_COMP_FIELDS,
            ),
        ):
            proc = _run(argv)
            if proc.returncode == 0:
                recs = app_records(parse_sacct(proc.stdout, fields), app_id)
                if recs:
                    return recs
        return []

    def _log_dir(self, app_id: str, recs: list[SlurmJobRecord]) -> str | None:
        """Slurm's word first (StdOut is ``<log_root>/slurm-%j.out``, see request.py): it
        works from any account and cannot be stale; then the file ``schedule`` wrote (the
        job has left slurmctld and sacct has no paths)."""
        for r in recs:
            if r.std_out and os.path.basename(os.path.dirname(r.std_out)) == LOG_SUBDIR:
                return os.path.join(os.path.dirname(r.std_out), app_id)
        recorded = self._recorded(app_id).get("log_dir")
        return str(recorded) if recorded else None

    def _roles(
        self, app_id: str, log_dir: str | None, recs: list[SlurmJobRecord]
    ) -> dict[str, int]:
        """Role -> replicas, in het order: from the job's comment (any shell), else the file
        ``schedule`` wrote, else the log dir's layout."""
        for r in recs:
            parsed = parse_comment(r.comment)
            if parsed and parsed[1]:
                return parsed[1]
        roles = self._recorded(app_id).get("roles")
        if roles:
            return {str(k): int(v) for k, v in roles.items()}
        out: dict[str, int] = {}
        if log_dir and os.path.isdir(log_dir):
            for name in sorted(os.listdir(log_dir)):
                sub = os.path.join(log_dir, name)
                if os.path.isdir(sub):
                    out[name] = len({f.split(".")[0] for f in os.listdir(sub)})
        return out

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        try:
            recs = self._records(app_id)
        except AppNotFoundError:
            return None
        if not recs:
            return None
        state, worst = fold_state(recs)
        log_dir = self._log_dir(app_id, recs)
        roles = self._roles(app_id, log_dir, recs)
        msg = explain(worst)
        if state in (AppState.FAILED, AppState.SUCCEEDED) and log_dir and _requeueing(log_dir):
            state = AppState.PENDING
            msg = f"requeued after attempt {worst.restarts - 1 if worst.restarts else 0}: {msg}"
        preempted = _read_lines(os.path.join(log_dir, "preempted")) if log_dir else []
        if preempted:
            msg += f"; {preemptions(preempted)}"
        statuses = []
        for i, (role, n) in enumerate(roles.items()):
            comp = recs[i] if i < len(recs) else worst
            hosts = expand_hostlist(comp.nodelist)
            replicas = []
            for k in range(n):
                base = os.path.join(log_dir, role, str(k)) if log_dir else ""
                replicas.append(self._replica(k, role, base, hosts, state))
            statuses.append(RoleStatus(role=role, replicas=replicas))
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=max(r.restarts for r in recs),
            msg=msg,
            structured_error_msg=_first_error(statuses, msg) if state == AppState.FAILED else "",
            roles_statuses=statuses,
            roles=self._role_specs(app_id, roles),
        )

    def _role_specs(self, app_id: str, roles: dict[str, int]) -> list[Role]:
        """The submitted roles when this account submitted the job, else names and counts."""
        saved = self._recorded(app_id).get("app")
        if saved:
            try:
                return appdef_from_dict(saved, f"{state_dir()}/{app_id}.json").roles
            except UsageError:
                pass
        return [Role(name=r, image="", num_replicas=n) for r, n in roles.items()]

    @staticmethod
    def _replica(k: int, role: str, base: str, hosts: list[str], app: AppState) -> ReplicaStatus:
        node = (_read_lines(base + ".node") or [""])[0].strip() if base else ""
        code_text = (_read_lines(base + ".exit") or [""])[0].strip() if base else ""
        code = int(code_text) if code_text.lstrip("-").isdigit() else None
        if code is not None and code != 0 and app == AppState.CANCELLED:
            # A cancel's SIGTERM makes a dist.ddp agent exit 143: that is the cancel, not a
            # failure of the replica (as on docker and local_cwd). The code is kept.
            state = AppState.CANCELLED
        elif code is not None:
            state = AppState.SUCCEEDED if code == 0 else AppState.FAILED
        elif code_text == LOST:
            state = AppState.FAILED  # its node was lost (the batch script marked it: losses.py)
        elif is_terminal(app) or app == AppState.PENDING:
            state = app
        else:
            state = AppState.RUNNING if node else AppState.PENDING
        host = node or (hosts[k] if k < len(hosts) else "")
        # what the replica's runtime agent named as the root cause (sacct knows only the code)
        err = root_cause_in(base + ".stderr") if base and state == AppState.FAILED else ""
        if code_text == LOST:
            err = f"node {host or '?'} was lost: the replica ended without an exit code"
        return ReplicaStatus(
            id=k, state=state, role=role, hostname=host, exit_code=code, structured_error_msg=err
        )

    # ------------------------------------------------------------------ logs
    def logs(self, app_id: str, query: LogQuery) -> Iterable[str]:
        """Replica ``k``'s log files (all attempts of a requeued job, appended); ``since`` and
        ``until`` are ignored: the files carry no timestamps."""
        role_name, k = query.role, query.k
        recs = self._records(app_id)
        if not recs:
            raise AppNotFoundError(f"slurm job {app_id} is unknown to squeue, scontrol and sacct")
        log_dir = self._log_dir(app_id, recs)
        if not log_dir:
            raise UsageError(
                f"slurm job {app_id} was not submitted by xrun (no {LOG_SUBDIR} dir in its StdOut "
                "path); read its output with `scontrol show job` instead"
            )
        roles = self._roles(app_id, log_dir, recs)
        if role_name not in roles:
            raise UsageError(
                f"app {app_id} has no role {role_name!r}; its roles: {', '.join(roles)}"
            )
        if not 0 <= k < roles[role_name]:
            raise UsageError(
                f"role {role_name!r} of app {app_id} has replicas 0..{roles[role_name] - 1}, not {k}"
            )
        kinds = query.stream_names()
        files = [os.path.join(log_dir, role_name, f"{k}.{kind}") for kind in kinds]

        def wait_done(timeout: float) -> bool:
            time.sleep(max(timeout, FOLLOW_POLL_S))
            resp = self.describe(app_id)
            return resp is None or is_terminal(resp.state)

        done = wait_done if query.follow else (lambda _t: True)
        return query.filter(iter_log_lines(files, query.follow, done))

    # ------------------------------------------------------------------ cancel / list
    def stacks(self, app_id: str, timeout: float = 10.0) -> Sequence[NodeStacks]:
        """Each node's agents' answers, asked by a task inside the job (see .stacks)."""
        from .stacks import gather_stacks

        resp = self.describe(app_id)
        if resp is None:
            raise AppNotFoundError(f"slurm job {app_id!r} not found")
        if resp.state != AppState.RUNNING:
            raise UsageError(
                f"slurm job {app_id} is {resp.state.name}: stacks are read from running workers"
            )
        log_dir = self._log_dir(app_id, self._records(app_id))
        if not log_dir or not os.path.isdir(log_dir):
            raise SchedulerError(f"slurm job {app_id}: its log dir {log_dir!r} is not here")
        return gather_stacks(app_id, log_dir, timeout)

    def cancel(self, app_id: str) -> None:
        resp = self.describe(app_id)
        if resp is None:
            raise AppNotFoundError(f"slurm job {app_id} is unknown to squeue, scontrol and sacct")
        if is_terminal(resp.state):
            return
        proc = _run(["scancel", app_id])
        if proc.returncode != 0:
            raise UsageError(f"`scancel {app_id}` failed: {proc.stderr.strip()}")

    def list(self) -> list[ListAppResponse]:
        by_app: dict[str, list[SlurmJobRecord]] = {}
        for rec in self._squeue_records() or []:
            by_app.setdefault(rec.app_id, []).append(rec)
        out = []
        for app_id, recs in by_app.items():
            leader = min(recs, key=lambda r: r.het_offset)
            parsed = parse_comment(leader.comment)
            if parsed is None:
                continue  # not submitted by xrun
            state, _ = fold_state(recs)
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=state,
                    name=parsed[0] or leader.name,
                    app_handle=f"slurm://{self.session_name}/{app_id}",
                )
            )
        return out


def _gone(proc: subprocess.CompletedProcess[str]) -> bool:
    """squeue -j of a job slurmctld no longer knows: an error, not an empty answer."""
    return proc.returncode != 0 and "invalid job id" in proc.stderr.lower()


def _first_error(roles: list[RoleStatus], default: str) -> str:
    errors = (r.structured_error_msg for s in roles for r in s.replicas)
    return next((e for e in errors if e), default)


def _read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.readlines()
    except OSError:
        return []


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    return SlurmScheduler(session_name)
