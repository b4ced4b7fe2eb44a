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
  ``$XDG_STATE_HOME`` when set). See :mod:`xrun.schedulers.local_store`.

A detached supervisor process (:mod:`xrun.schedulers.local_supervisor`) owns the replicas, so
the app survives its launcher (SIGKILL the ``xrun run`` and the job goes on), and every query
(``status``/``describe``/``log``/``cancel``/``list``) reads the state it keeps on disk, from any
process. Gang semantics: one replica exiting non-zero fails the app and stops the others
(SIGTERM to their process groups, ``stop_grace_s``, SIGKILL). ``cancel`` ends it CANCELLED.
Exit codes: negative = killed by that signal. ``log_iter`` ignores ``since``/``until`` (lines
carry no timestamps). ``max_retries`` is not applied here: restarts belong to the runtime agent
(``dist.ddp --max_retries`` -> ``--max-restarts``).
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from xrun.errors import AppNotFoundError, SchedulerError, UsageError
from xrun.schedulers import local_store as store
from xrun.schedulers.api import (
    AppDryRunInfo,
    CfgVal,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
    runopts,
)
from xrun.schedulers.local_logs import POLL_S, iter_log_lines
from xrun.schedulers.local_supervisor import TERMINAL, is_alive, write_json_atomic
from xrun.specs import (
    AppDef,
    AppState,
    ReplicaStatus,
    Role,
    RoleStatus,
    appdef_from_dict,
    appdef_to_dict,
    is_terminal,
    macros,
    make_app_handle,
)

RANK0_ENV = "XRUN_RANK0_HOST"
SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_supervisor.py")
# How long schedule() waits for the supervisor to report its replicas started.
_START_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- the request value
@dataclass
class ReplicaRequest:
    role: str
    id: int
    argv: list[str]
    env: dict[str, str]  # set on top of the launcher's environment
    stdout: str
    stderr: str
    error_file: str


@dataclass
class LocalRequest:
    """Everything schedule() needs; its text form is what ``--dryrun`` prints."""

    app_id: str
    app_dir: str
    cwd: str
    grace_s: float
    replicas: list[ReplicaRequest]
    app: dict[str, Any] = field(default_factory=dict)  # appdef_to_dict form, for describe()
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def format_request(req: LocalRequest) -> str:
    lines = [
        f"# local_cwd app {req.app_id}: {len(req.replicas)} replica(s) in {req.cwd}",
        f"# logs and state: {req.app_dir}",
        f"# a replica failing stops the others: SIGTERM, {req.grace_s:g}s grace, SIGKILL",
    ]
    lines += [f"# note: {n}" for n in req.notes]
    for r in req.replicas:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(r.env.items()))
        lines.append(f"# {r.role}/{r.id}: stdout {r.stdout}, stderr {r.stderr}")
        lines.append(f"env {env} {shlex.join(r.argv)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- helpers
def make_app_id(name: str) -> str:
    """``<name as a slug>-<10 random chars>``: readable, unique, safe as a dir name."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:40] or "app"
    # os.urandom rather than `secrets`: that module pulls in hashlib/OpenSSL (~10 ms at start-up)
    n = int.from_bytes(os.urandom(8), "big")
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    token = ""
    for _ in range(10):
        n, d = divmod(n, 36)
        token += alphabet[d]
    return f"{slug}-{token}"


def _which(cmd: str, path: str, cwd: str) -> str | None:
    """Where ``cmd`` would be executed from, searching ``path`` (as execvpe does), or None."""
    if os.sep in cmd:
        full = os.path.join(cwd, cmd)
        return full if os.path.isfile(full) and os.access(full, os.X_OK) else None
    for d in path.split(os.pathsep):
        full = os.path.join(d or ".", cmd)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return full
    return None


def visible_gpus() -> list[str]:
    """GPU ids replicas may use: ``CUDA_VISIBLE_DEVICES`` if set, else the NVIDIA driver's."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def assign_gpus(roles: list[Role], devices: list[str]) -> dict[tuple[str, int], list[str]]:
    """Split ``devices`` across replicas by ``resource.gpu``, in role/replica order.

    No devices: nothing assigned (a CPU host runs the same app unchanged).
    """
    out: dict[tuple[str, int], list[str]] = {}
    if not devices:
        return out
    wanted = sum(max(r.resource.gpu, 0) * r.num_replicas for r in roles)
    if wanted > len(devices):
        detail = ", ".join(f"{r.name}: {r.num_replicas} x {r.resource.gpu}" for r in roles)
        raise UsageError(
            f"auto_set_cuda_visible_devices: the app asks for {wanted} GPUs ({detail}) but this "
            f"host has {len(devices)} visible ({','.join(devices)}); ask for fewer (-j, --gpu) "
            "or pass -cfg auto_set_cuda_visible_devices=False"
        )
    nxt = 0
    for role in roles:
        for i in range(role.num_replicas):
            if role.resource.gpu > 0:
                out[(role.name, i)] = devices[nxt : nxt + role.resource.gpu]
                nxt += role.resource.gpu
    return out


def _path_with(first: list[str], path: str) -> str:
    """``first`` + ``path``'s entries, each dir once (the first occurrence wins)."""
    parts = first + [p for p in path.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


_REPLICA_STATES = {
    "PENDING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "STOPPING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
    "CANCELLED": AppState.CANCELLED,
}


class _Child:
    """A supervisor that this process started (forked or exec'd): wait for it and reap it."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.popen = popen  # kept so subprocess does not reap it behind our back
        self.code: int | None = None

    def wait(self, timeout: float | None) -> int | None:
        """Block up to ``timeout`` s (None: for ever); the exit code once it has ended."""
        if self.code is not None:
            return self.code
        if self.popen is not None:
            try:
                self.code = self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
            return self.code
        if timeout is not None:
            try:
                fd: int | None = os.pidfd_open(self.pid)
            except (AttributeError, OSError):  # no pidfds (old kernel, not Linux): poll
                fd = None
            if fd is not None:
                try:
                    select.select([fd], [], [], timeout)
                finally:
                    os.close(fd)
            deadline = time.monotonic() + timeout
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid or time.monotonic() >= deadline:
                    break
                time.sleep(POLL_S)
            if pid == 0:
                return None
        else:
            _, status = os.waitpid(self.pid, 0)
        self.code = os.waitstatus_to_exitcode(status)
        return self.code


# --------------------------------------------------------------------------- the scheduler
class LocalCwdScheduler(Scheduler[LocalRequest]):
    backend = "local_cwd"

    def __init__(self, session_name: str) -> None:
        super().__init__(session_name)
        # Supervisors this process started: wait() on them directly (no polling).
        self._children: dict[str, _Child] = {}

    def run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "log_dir",
            str,
            "dir for the apps' logs and state: <log_dir>/<app_id>/<role>/<replica>/"
            "{stdout,stderr}.log; default $XDG_STATE_HOME/xrun/local_cwd/logs "
            "(~/.local/state/xrun/local_cwd/logs)",
        )
        opts.add(
            "prepend_cwd", bool, "put the cwd on PATH (after the interpreter's bin dir)", False
        )
        opts.add(
            "auto_set_cuda_visible_devices",
            bool,
            "give each replica its own CUDA_VISIBLE_DEVICES, resource.gpu devices each "
            "(no-op on a host without GPUs)",
            False,
        )
        opts.add(
            "stop_grace_s",
            float,
            "seconds a stopped replica gets between SIGTERM and SIGKILL (on cancel, or when a "
            "sibling fails)",
            10.0,
        )
        return opts

    # ---- dry run: build the value, no side effects
    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal]) -> AppDryRunInfo[LocalRequest]:
        app_id = make_app_id(app.name)
        log_dir = os.path.abspath(
            os.path.expanduser(str(cfg["log_dir"] or store.default_log_dir()))
        )
        paths = store.AppPaths(os.path.join(log_dir, app_id))
        cwd = os.getcwd()
        grace = float(cfg["stop_grace_s"])  # type: ignore[arg-type]
        if grace < 0:
            raise UsageError(f"run option stop_grace_s={grace:g} must be >= 0 (seconds)")
        first = [os.path.dirname(sys.executable)] + ([cwd] if cfg["prepend_cwd"] else [])
        path = _path_with(first, os.environ.get("PATH", os.defpath))
        gpus = (
            assign_gpus(app.roles, visible_gpus()) if cfg["auto_set_cuda_visible_devices"] else {}
        )
        replicas = []
        notes = []
        for role in app.roles:
            if role.mounts:
                notes.append(
                    f"role {role.name}: mounts are ignored (local_cwd uses the host's files)"
                )
            for i in range(role.num_replicas):
                values = macros.Values(
                    img_root=cwd, app_id=app_id, replica_id=str(i), rank0_env=RANK0_ENV
                )
                r = values.apply(role)
                env = {
                    "PATH": path,
                    "PYTHONUNBUFFERED": "1",
                    RANK0_ENV: "localhost",
                    "TORCHELASTIC_ERROR_FILE": paths.error_file(role.name, i),
                }
                if (role.name, i) in gpus:
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(role.name, i)])
                env.update(r.env)  # the role's own env wins, PATH included
                self._check_entrypoint(role.name, r.entrypoint, env["PATH"], cwd)
                replicas.append(
                    ReplicaRequest(
                        role=role.name,
                        id=i,
                        argv=[r.entrypoint, *r.args],
                        env=env,
                        stdout=paths.log_file(role.name, i, "stdout"),
                        stderr=paths.log_file(role.name, i, "stderr"),
                        error_file=paths.error_file(role.name, i),
                    )
                )
        req = LocalRequest(app_id, paths.app_dir, cwd, grace, replicas, appdef_to_dict(app), notes)
        return AppDryRunInfo(req, format_request)

    @staticmethod
    def _check_entrypoint(role: str, entrypoint: str, path: str, cwd: str) -> None:
        if not _which(entrypoint, path, cwd):
            raise UsageError(
                f"role {role!r}: entrypoint {entrypoint!r} is not an executable on PATH or "
                f"relative to {cwd}; give an existing command (e.g. python3) or a path to an "
                "executable file"
            )

    # ---- schedule: make the dirs, start the supervisor
    def schedule(self, dryrun_info: AppDryRunInfo[LocalRequest]) -> str:
        req = dryrun_info.request
        paths = store.AppPaths(req.app_dir)
        store.make_private_dirs(os.path.dirname(req.app_dir))
        try:
            os.mkdir(req.app_dir, 0o700)
        except FileExistsError:
            raise SchedulerError(
                f"{req.app_dir} already exists: this dry run was already scheduled; "
                "make a new one (submit_dryrun) for another run"
            ) from None
        os.mkdir(paths.state_dir, 0o700)
        for r in req.replicas:
            store.make_private_dirs(paths.replica_dir(r.role, r.id))
            # Created now, so a reader that comes before the replica starts finds them.
            for f in (r.stdout, r.stderr):
                os.close(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        write_json_atomic(paths.request, req.to_json())
        store.register(req.app_id, req.app_dir)
        if os.getcwd() != req.cwd:
            raise SchedulerError(
                f"the cwd changed from {req.cwd} to {os.getcwd()} since the dry run; "
                "schedule() runs the replicas in the dry run's cwd: change back, or dry-run again"
            )
        self._children[req.app_id] = self._start_supervisor(paths, req.cwd)
        return req.app_id

    def _start_supervisor(self, paths: store.AppPaths, cwd: str) -> _Child:
        """Start the app's supervisor and wait until it reports the replicas started."""
        rfd, wfd = os.pipe()
        try:
            child = self._fork_supervisor(paths, wfd) or self._exec_supervisor(paths, cwd, wfd)
        finally:
            os.close(wfd)
        try:
            ready, _, _ = select.select([rfd], [], [], _START_TIMEOUT_S)
            answer = os.read(rfd, 16) if ready else b""
        finally:
            os.close(rfd)
        if answer.startswith(b"ok"):
            return child
        if not ready:
            _killpg(child.pid, signal.SIGKILL)
        code = child.wait(None)
        with open(paths.supervisor_log, errors="replace") as f:
            tail = f.read()[-2000:].strip()
        raise SchedulerError(
            f"the local_cwd supervisor did not start the app (exit code {code}); "
            f"its log {paths.supervisor_log}:\n{tail}"
        )

    @staticmethod
    def _fork_supervisor(paths: store.AppPaths, ready_fd: int) -> _Child | None:
        """Fork the supervisor off this process: no interpreter start-up on the hot path.

        Only from a single-threaded process's main thread (a fork copies just the calling
        thread; another thread's locks would stay locked in the child forever), and only where
        the cwd is the app's cwd (it is: the request was made here). None: exec instead.
        """
        import threading

        if (
            threading.active_count() != 1
            or threading.current_thread() is not threading.main_thread()
        ):
            return None
        if not hasattr(os, "fork"):
            return None
        pid = os.fork()
        if pid == 0:  # the child: never returns
            from xrun.schedulers.local_supervisor import serve_forked

            serve_forked(paths.state_dir, ready_fd, paths.supervisor_log)
        return _Child(pid)

    @staticmethod
    def _exec_supervisor(paths: store.AppPaths, cwd: str, ready_fd: int) -> _Child:
        # -S: skip the site-packages scan (the supervisor needs the stdlib only); -P (3.11+):
        # do not put the schedulers dir first on sys.path, where it could shadow stdlib names.
        flags = ["-S", "-P"] if sys.version_info >= (3, 11) else ["-S"]
        log_fd = os.open(paths.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                [sys.executable, *flags, SUPERVISOR, paths.state_dir, "--ready-fd", str(ready_fd)],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                pass_fds=(ready_fd,),
                start_new_session=True,  # not in our process group: Ctrl-C/SIGKILL of us spare it
            )
        finally:
            os.close(log_fd)
        return _Child(proc.pid, proc)

    # ---- queries
    def _paths(self, app_id: str) -> store.AppPaths:
        paths = store.find(app_id)
        if paths is None:
            raise AppNotFoundError(
                f"local_cwd app {app_id!r} not found (no entry in {store.index_dir()}); "
                "`xrun list -s local_cwd` shows this user's apps"
            )
        return paths

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        paths = store.find(app_id)
        if paths is None:
            return None
        req = store.read_json(paths.request)
        if req is None:
            return None
        st = store.read_json(paths.state)
        roles = appdef_from_dict(req["app"], paths.request).roles
        resp = DescribeAppResponse(app_id=app_id, roles=roles)
        if st is None:  # schedule() is starting the supervisor right now
            resp.state = AppState.SUBMITTED
            return resp
        resp.state = AppState[st["state"]]
        resp.msg = st.get("msg", "")
        reps = st["replicas"]
        states = [_REPLICA_STATES.get(r["state"], AppState.UNKNOWN) for r in reps]
        sup = st["supervisor"]
        if st["state"] not in TERMINAL and not is_alive(sup["pid"], sup["start"]):
            alive = [is_alive(r["pid"], r["start"]) for r in reps]
            states = [
                AppState.RUNNING if a else (s if is_terminal(s) else AppState.UNKNOWN)
                for a, s in zip(alive, states, strict=True)
            ]
            if any(alive):
                resp.state = AppState.UNKNOWN
                resp.msg = (
                    f"the supervisor (pid {sup['pid']}) is gone but {sum(alive)} replica(s) still "
                    f"run; `xrun cancel` stops them (its log: {paths.supervisor_log})"
                )
            else:
                resp.state = AppState.FAILED
                resp.msg = (
                    f"the supervisor (pid {sup['pid']}) died before the app ended; "
                    f"see {paths.supervisor_log}"
                )
        by_role: dict[str, RoleStatus] = {r.name: RoleStatus(r.name) for r in roles}
        for r, state in zip(reps, states, strict=True):
            err = ""
            if state == AppState.FAILED:
                err = store.read_error_summary(paths.error_file(r["role"], r["id"]))
                if not err and r.get("msg"):
                    err = r["msg"]
                if err and not resp.structured_error_msg:
                    resp.structured_error_msg = err
            by_role[r["role"]].replicas.append(
                ReplicaStatus(
                    id=r["id"],
                    state=state,
                    role=r["role"],
                    hostname="localhost",
                    exit_code=r["exit_code"],
                    structured_error_msg=err,
                )
            )
        resp.roles_statuses = list(by_role.values())
        return resp

    def list(self) -> list[ListAppResponse]:
        out = []
        for app_id in store.indexed_app_ids():
            paths = store.find(app_id)
            resp = self.describe(app_id) if paths else None
            if resp is None:  # its log dir was deleted
                continue
            req = store.read_json(paths.request) if paths else None
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=resp.state,
                    name=str((req or {}).get("app", {}).get("name", "")),
                    app_handle=make_app_handle(app_id, self.backend, self.session_name),
                )
            )
        return out

    # ---- waiting
    def _supervisor_pidfd(self, paths: store.AppPaths) -> int | None:
        """A pidfd of the app's live supervisor (readable once it exits), or None."""
        st = store.read_json(paths.state)
        if st is None or not hasattr(os, "pidfd_open"):
            return None
        sup = st["supervisor"]
        try:
            fd = os.pidfd_open(sup["pid"])
        except OSError:
            return None
        # Checked after opening: the fd now pins the process, so a pid reused in between
        # shows up as a start-time mismatch instead of going unnoticed.
        if not is_alive(sup["pid"], sup["start"]):
            os.close(fd)
            return None
        return fd

    def wait(self, app_id: str, timeout: float | None = None) -> DescribeAppResponse | None:
        child = self._children.get(app_id)
        if child is not None:
            if child.wait(timeout) is not None:
                del self._children[app_id]
            return self.describe(app_id)
        paths = store.find(app_id)
        if paths is None:
            return None
        fd = self._supervisor_pidfd(paths)
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

    def _done_waiter(self, app_id: str, paths: store.AppPaths) -> Callable[[float], bool]:
        """``done(timeout)``: block up to ``timeout`` s; True once the app has ended."""
        fd = self._supervisor_pidfd(paths)
        if fd is not None:

            def done(timeout: float) -> bool:
                ready, _, _ = select.select([fd], [], [], timeout)
                return bool(ready)

            return done

        def done_polling(timeout: float) -> bool:
            resp = self.describe(app_id)
            if resp is None or resp.state not in (
                AppState.SUBMITTED,
                AppState.PENDING,
                AppState.RUNNING,
                AppState.UNKNOWN,
            ):
                return True
            time.sleep(timeout)
            return False

        return done_polling

    # ---- logs
    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: float | None = None,
        until: float | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        paths = self._paths(app_id)
        req = store.read_json(paths.request) or {}
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
        kinds = {Stream.STDOUT: ["stdout"], Stream.STDERR: ["stderr"]}.get(
            streams or Stream.COMBINED, ["stdout", "stderr"]
        )
        files = [paths.log_file(role_name, k, s) for s in kinds]
        wait_done = self._done_waiter(app_id, paths) if should_tail else (lambda _t: True)
        return filter_regex(regex, iter_log_lines(files, should_tail, wait_done))

    # ---- cancel
    def cancel(self, app_id: str) -> None:
        paths = self._paths(app_id)
        st = store.read_json(paths.state)
        deadline = time.monotonic() + 10
        while st is None and time.monotonic() < deadline:  # another process is scheduling it
            time.sleep(POLL_S)
            st = store.read_json(paths.state)
        if st is None or st["state"] in TERMINAL:
            return
        req = store.read_json(paths.request) or {}
        grace = float(req.get("grace_s", 10.0))
        sup = st["supervisor"]
        fd = self._supervisor_pidfd(paths)
        if fd is not None:
            os.close(fd)
            os.kill(sup["pid"], signal.SIGTERM)  # the supervisor stops the replicas
            self.wait(app_id, timeout=grace + 5)
        elif not is_alive(sup["pid"], sup["start"]):
            _stop_orphans(paths, st, grace)

    def close(self) -> None:
        # Reap supervisors that have ended; live ones go on without us (by design).
        for app_id, child in list(self._children.items()):
            if child.wait(0) is not None:
                del self._children[app_id]


def _stop_orphans(paths: store.AppPaths, st: dict[str, Any], grace: float) -> None:
    """Cancel an app whose supervisor died: stop its replicas ourselves and record CANCELLED."""
    live = [r for r in st["replicas"] if is_alive(r["pid"], r["start"])]
    for r in live:
        _killpg(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(POLL_S)
        live = [r for r in live if is_alive(r["pid"], r["start"])]
    for r in live:
        _killpg(r["pid"], signal.SIGKILL)
    for r in st["replicas"]:
        if r["state"] not in TERMINAL:
            r["state"] = "CANCELLED"
    st.update(
        state="CANCELLED",
        msg="cancelled by request (after the supervisor died)",
        ended_at=time.time(),
    )
    write_json_atomic(paths.state, st)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def create_scheduler(session_name: str, **kwargs: Any) -> LocalCwdScheduler:
    return LocalCwdScheduler(session_name)


__all__ = [
    "LocalCwdScheduler",
    "LocalRequest",
    "ReplicaRequest",
    "create_scheduler",
]
