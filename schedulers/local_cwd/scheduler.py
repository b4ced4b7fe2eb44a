"""The ``local_cwd`` scheduler: every replica is a process on this host, in the current dir.

::

    xrun run -s local_cwd dist.ddp -j 2x2 --script examples/train_ddp.py

What a replica gets (``xrun run --dryrun -s local_cwd ...`` prints it all):

* its command ``entrypoint + args`` as an argv, run in the cwd (the role's ``image`` is ignored),
  with the macros substituted: ``${img_root}`` = the cwd, ``${app_id}``, ``${replica_id}``, and
  ``${rank0_env}`` = ``XRUN_RANK0_HOST``, an env var set to ``localhost`` in every replica;
* ``PATH`` = the launching interpreter's bin dir, then the cwd when ``prepend_cwd=True``, then
  the caller's ``PATH``: a role's ``python3`` is xrun's own interpreter (its venv/conda env);
* ``PYTHONUNBUFFERED=1`` (logs appear as they are printed), ``TORCHELASTIC_ERROR_FILE`` (the
  replica's ``error.json``, which the runtime agent fills on failure), ``CUDA_VISIBLE_DEVICES``
  when ``auto_set_cuda_visible_devices=True`` and the host has GPUs;
* stdout/stderr in ``<log_dir>/<app_id>/<role>/<replica>/{stdout,stderr}.log`` (dirs 0700,
  files 0600); ``log_dir`` defaults to ``~/.local/state/xrun/local_cwd/logs`` (under
  ``$XDG_STATE_HOME`` when set). See :mod:`xrun.schedulers.local_cwd.statedir`.

A detached supervisor process owns the replicas, so the app survives its launcher (SIGKILL the
``xrun run`` and the job goes on), and every query (``status``/``describe``/``log``/``cancel``/
``list``) reads the state it keeps on disk, from any process and any shell.

* Gang semantics: one replica exiting non-zero fails the app and stops the others (SIGTERM to
  their process groups, ``stop_grace_s``, SIGKILL). An elastic role (``-j 1:3x2``) may lose
  replicas down to ``max(min_replicas, 1)`` first: its agents carry on with fewer nodes.
* ``cancel`` (or SIGTERM to the supervisor, whose pid is in ``.xrun/state.json``) stops every
  replica the same way; the app ends CANCELLED. Unknown app: ``describe`` -> None, ``cancel``
  and ``log_iter`` -> :class:`~xrun.errors.AppNotFoundError`.
* Exit codes: a negative one means killed by that signal. ``log_iter`` yields lines with their
  ``\\n`` and ignores ``since``/``until`` (lines carry no timestamps).
* Retries: this scheduler never runs a replica again. ``dist.* --max_retries N`` is the
  runtime agent's ``--max-restarts N`` (the workers restart in place: N+1 attempts, the one
  owner of retries here as on docker and slurm); another role's ``max_retries`` (utils.sh's)
  is not applied on local_cwd (TorchX's local scheduler does not retry either).
* A port the app asks for (``port_map``, e.g. ``dist.ddp --rdzv_port``) that is taken on this
  host is refused at submit (exit 2), except the components' default rendezvous port, for
  which each multi-node app gets a free port of its own (``XRUN_RDZV_PORT``).

One file per step, in this package: ``request`` (the dry-run value), ``launch`` (dirs + starting
the supervisor), ``supervisor`` (the detached process), ``status`` (reading the state), ``statedir``
(layout and the per-user index); reading/following the log files is the shared
:mod:`xrun.schedulers.logs`.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from xrun.config import current_dir
from xrun.errors import AppNotFoundError, SchedulerError, UsageError
from xrun.procs import is_alive, signal_if_same
from xrun.specs import AppDef, AppState, make_app_handle

from ..api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    LogQuery,
    Scheduler,
    runopts,
)
from ..logs import POLL_S, iter_log_lines
from . import procs, statedir
from .options import LocalOptions
from .request import (
    LocalRequest,
    build_request,
    check_ports_free,
    check_scripts_exist,
    format_request,
    with_rdzv_env,
)
from .status import describe_app, request_grace, stop_orphans, supervisor_pidfd
from .supervisor import TERMINAL

if TYPE_CHECKING:
    from ..stacks import NodeStacks
    from ..workspace import Workspace
    from .launch import Child

# States in which an app may still change (UNKNOWN: its supervisor died, replicas run on).
_LIVE = (AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING, AppState.UNKNOWN)


def check_no_workspace(workspace: str | None) -> None:
    """local_cwd runs the job in the current directory: a ``--workspace`` elsewhere would be
    ignored, and the user who expects the job to run there is told so at once (M11). The cwd
    itself (or nothing) is accepted without a word."""
    if not workspace:
        return
    cwd = current_dir()
    path = workspace.removeprefix("file://") if workspace.startswith("file:///") else workspace
    if "://" not in path and os.path.realpath(path) == os.path.realpath(cwd):
        return
    raise UsageError(
        f"--workspace {workspace!r}: local_cwd runs the job in the current directory ({cwd}); "
        "--workspace is for docker and slurm: cd to the folder instead, or drop --workspace"
    )


# --------------------------------------------------------------------------- the scheduler
class LocalCwdScheduler(Scheduler[LocalRequest]):
    backend = "local_cwd"

    def __init__(self, session_name: str) -> None:
        super().__init__(session_name)
        # Supervisors this process started: wait() on them directly (no polling).
        self._children: dict[str, Child] = {}

    def run_opts(self) -> runopts[LocalOptions]:
        return runopts(LocalOptions)

    # ---- the workspace: none, the job runs here
    def open_workspace(self, given: Workspace | str | None) -> None:
        # A value is named as it was given (no isinstance: the workspace module stays unloaded)
        check_no_workspace(
            given if given is None or isinstance(given, str) else given.given or given.url
        )
        return None

    # ---- dry run: build the value, no side effects (never given a workspace: see above)
    def _submit_dryrun(
        self, app: AppDef, cfg: LocalOptions, workspace: Workspace | None = None
    ) -> AppDryRunInfo[LocalRequest]:
        return AppDryRunInfo(build_request(app, cfg), format_request)

    # ---- schedule: make the dirs, start the supervisor
    def schedule(self, dryrun_info: AppDryRunInfo[LocalRequest]) -> str:
        check_scripts_exist(dryrun_info.request)
        check_ports_free(dryrun_info.request)
        # benchmark 5: a dry run builds the request and starts nothing (launch: subprocess)
        from .launch import launch

        req = with_rdzv_env(dryrun_info.request)
        self._children[req.app_id] = launch(req)
        return req.app_id

    # ---- queries
    def _paths(self, app_id: str) -> statedir.AppPaths:
        paths = statedir.find(app_id)
        if paths is None:
            raise AppNotFoundError(
                f"local_cwd app {app_id!r} not found (no entry in {statedir.index_dir()}); "
                "`xrun list -s local_cwd` shows this user's apps"
            )
        return paths

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        paths = statedir.find(app_id)
        if paths is not None:
            return describe_app(app_id, paths)
        found = procs.app_processes(app_id=app_id) if statedir.valid_app_id(app_id) else {}
        if not found:
            return None
        # Its files are gone (the state dir was deleted) but it runs: say so, and how to stop it.
        handle = make_app_handle(self.backend, self.session_name, app_id)
        return DescribeAppResponse(
            app_id=app_id,
            state=AppState.UNKNOWN,
            msg=(
                f"the app's files are gone ({sorted(set(found.values()))[0]} was deleted) but "
                f"{len(found)} of its processes still run; `xrun cancel {handle}` stops them"
            ),
        )

    def list(self) -> list[ListAppResponse]:
        """This user's apps (from the index, whatever their log_dir), oldest first."""
        found = []
        for app_id in statedir.indexed_app_ids():
            paths = statedir.find(app_id)
            if paths is None:  # its log dir was deleted: forget it
                statedir.unregister(app_id)
                continue
            try:
                resp = self.describe(app_id)
                req = statedir.read_request(paths.request)
            except (SchedulerError, UsageError):
                # A damaged record (`status` names it) must not hide every other app.
                resp, req = DescribeAppResponse(app_id=app_id, state=AppState.UNKNOWN), {}
            if resp is None or req is None:
                continue
            item = ListAppResponse(
                app_id=app_id,
                state=resp.state,
                name=str(req.get("app", {}).get("name", "")),
                app_handle=make_app_handle(self.backend, self.session_name, app_id),
            )
            found.append((os.stat(paths.request).st_mtime, item))
        return [item for _, item in sorted(found, key=lambda f: f[0])]

    # ---- waiting
    def wait(self, app_id: str, timeout: float | None = None) -> DescribeAppResponse | None:
        child = self._children.get(app_id)
        if child is not None:
            if child.wait(timeout) is not None:
                del self._children[app_id]
            return self.describe(app_id)
        paths = statedir.find(app_id)
        if paths is None:
            return None
        fd = supervisor_pidfd(paths)
        if fd is None:
            resp = self.describe(app_id)
            if resp is None or resp.state != AppState.SUBMITTED:
                return resp  # the supervisor is gone: nothing more will change by itself
            return super().wait(app_id, timeout)
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
        return self.describe(app_id)

    def _follow(
        self, app_id: str, paths: statedir.AppPaths, files: Sequence[str], should_tail: bool
    ) -> Iterator[str]:
        """The lines of ``files``; with ``should_tail``, until the app ends."""
        fd = supervisor_pidfd(paths) if should_tail else None

        def done(timeout: float) -> bool:
            """Block up to ``timeout`` s; True once the app has ended."""
            if fd is not None:  # readable the moment the supervisor exits: no polling lag
                ready, _, _ = select.select([fd], [], [], timeout)
                return bool(ready)
            resp = self.describe(app_id)
            if resp is None or resp.state not in _LIVE:
                return True
            time.sleep(timeout)
            return False

        try:
            yield from iter_log_lines(files, should_tail, done)
        finally:  # also when the caller stops early (the generator is closed)
            if fd is not None:
                os.close(fd)

    # ---- logs
    def logs(self, app_id: str, query: LogQuery) -> Iterable[str]:
        role_name, k = query.role, query.k
        paths = self._paths(app_id)
        req = statedir.read_request(paths.request) or {}
        counts: dict[str, int] = {}
        for r in req.get("replicas", []):
            counts[r["role"]] = counts.get(r["role"], 0) + 1
        if role_name not in counts:
            raise UsageError(
                f"app {app_id} has no role {role_name!r}; its roles: {', '.join(counts)}"
            )
        if not 0 <= k < counts[role_name]:
            raise UsageError(
                f"role {role_name!r} of app {app_id} has replicas 0..{counts[role_name] - 1}, "
                f"not {k}"
            )
        kinds = query.stream_names()
        files = [paths.log_file(role_name, k, s) for s in kinds]
        return query.filter(self._follow(app_id, paths, files, query.follow))

    # ---- stacks
    def stacks(self, app_id: str, timeout: float = 10.0) -> Sequence[NodeStacks]:
        """Ask each replica's agent (its request FIFO) for its workers' stacks; see ``..stacks``."""
        from ..stacks import NodeStacks, gather, is_agent, target_of

        paths = self._paths(app_id)
        st = statedir.read_state(paths.state)  # a damaged record: one line, as for status
        if st is None or st["state"] in TERMINAL:
            state = "not started" if st is None else st["state"]
            raise UsageError(
                f"local_cwd app {app_id} is {state}: stacks are read from running workers "
                f"(`xrun status local_cwd://{self.session_name}/{app_id}`)"
            )
        targets = {}
        skipped = []
        for rep in st["replicas"]:
            name, pid = f"{rep['role']}/{rep['id']}", rep["pid"]
            if not (pid and is_alive(pid, rep["start"])):
                skipped.append(NodeStacks(name, note="not running"))
            elif not is_agent(pid):
                skipped.append(NodeStacks(name, note="not an xrun runtime agent (no stacks)"))
            else:
                how = target_of(pid)
                if isinstance(how, str):
                    skipped.append(NodeStacks(name, note=how))
                else:
                    targets[name] = how
        return skipped + gather(targets, timeout)

    # ---- cancel
    def cancel(self, app_id: str) -> None:
        """Stop the app and return once every one of its processes has ended (the supervisor's
        word is not taken for it: the processes are looked up, see :mod:`.procs`);
        SchedulerError naming those that would not end."""
        paths = statedir.find(app_id)
        if paths is None:
            self._cancel_lost(app_id)
            return
        st = statedir.read_state(paths.state)
        deadline = time.monotonic() + 10
        while st is None and time.monotonic() < deadline:  # another process is scheduling it
            time.sleep(POLL_S)
            st = statedir.read_state(paths.state)
        grace = request_grace(paths)
        if st is not None and st["state"] not in TERMINAL:
            sup = st["supervisor"]
            # the supervisor stops the replicas (never a later process that took its pid)
            if signal_if_same(sup["pid"], sup["start"], signal.SIGTERM):
                self.wait(app_id, timeout=grace + 5)
            # Liveness first, then the record: a supervisor found dead wrote its last record
            # before it exited (read the other way round, a stale one would overwrite it).
            gone = not is_alive(sup["pid"], sup["start"])
            st = statedir.read_state(paths.state) or st
            if gone and st["state"] not in TERMINAL:
                stop_orphans(paths, st, grace)  # it died (before or during the stop)
        self._check_all_ended(app_id, procs.app_processes(app_dir=paths.app_dir), grace)

    def _cancel_lost(self, app_id: str) -> None:
        """Cancel an app whose files are gone (its state dir was deleted) by its processes."""
        found = procs.app_processes(app_id=app_id)
        if not found:
            raise AppNotFoundError(
                f"local_cwd app {app_id!r} not found (no entry in {statedir.index_dir()}, and no "
                "process of it runs); `xrun list -s local_cwd` shows this user's apps"
            )
        self._check_all_ended(app_id, found, 10.0)

    def _check_all_ended(self, app_id: str, found: dict[procs.Proc, str], grace: float) -> None:
        """Stop what is left of the app (a replica's process that outlived it, workers whose
        agent is gone) and raise unless all of it ended."""
        if not found:
            return
        left = procs.stop(list(found), grace)
        if left:
            pids = ", ".join(str(pid) for pid, _ in left)
            raise SchedulerError(
                f"cancel of {app_id} could not stop process(es) {pids} (still running after "
                f"SIGTERM, {grace:g}s and SIGKILL); see `ps -o pid,stat,cmd -p {pids}`"
            )

    def close(self) -> None:
        # Reap supervisors that have ended; live ones go on without us (by design).
        for app_id, child in list(self._children.items()):
            if child.wait(0) is not None:
                del self._children[app_id]


def create_scheduler(session_name: str, **kwargs: Any) -> LocalCwdScheduler:
    return LocalCwdScheduler(session_name)
