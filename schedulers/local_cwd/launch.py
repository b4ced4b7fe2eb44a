"""Starting a local_cwd app: its dirs, its files, its detached supervisor.

The supervisor (:mod:`xrun.schedulers.local_cwd.supervisor`) is forked from the launching
process when that is safe (single-threaded, main thread: no interpreter start-up on the hot path)
and exec'd as ``python -S .../local_cwd/supervisor.py`` otherwise. Either way it runs in its
own session, so the app outlives its launcher.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from xrun.errors import SchedulerError, UsageError

from ..logs import POLL_S
from . import statedir
from .procs import killpg
from .request import LocalRequest
from .supervisor import write_json_atomic

SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")
# How long launch() waits for the supervisor to report its replicas started.
_START_TIMEOUT_S = 60.0


class Child:
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


def launch(req: LocalRequest) -> Child:
    """Make the app's dirs and files, start its supervisor; the supervisor, once running."""
    # A forked supervisor inherits our cwd, and the replicas inherit the supervisor's.
    if os.getcwd() != req.cwd:
        raise SchedulerError(
            f"the cwd changed from {req.cwd} to {os.getcwd()} since the dry run; "
            "schedule() runs the replicas in the dry run's cwd: change back, or dry-run again"
        )
    paths = statedir.AppPaths(req.app_dir)
    log_dir = os.path.dirname(req.app_dir)
    try:
        statedir.make_private_dirs(log_dir)
        os.mkdir(req.app_dir, 0o700)
    except FileExistsError:
        raise SchedulerError(
            f"{req.app_dir} already exists: this dry run was already scheduled; "
            "make a new one (submit_dryrun) for another run"
        ) from None
    except OSError as e:
        raise UsageError(
            f"cannot create the app's dir in log_dir {log_dir!r}: {e.strerror or e}; give a "
            "writable directory (-cfg log_dir=DIR)"
        ) from None
    try:
        _make_files(req, paths)
        statedir.register(req.app_id, req.app_dir)
    except BaseException as e:
        # Nothing of an app that cannot start stays behind (a half-made dir, an index entry).
        import shutil

        statedir.unregister(req.app_id)
        shutil.rmtree(req.app_dir, ignore_errors=True)
        if isinstance(e, OSError):
            raise UsageError(
                f"cannot write the app's files under {req.app_dir!r}: {e.strerror or e}; give "
                "a writable directory with room to spare (-cfg log_dir=DIR)"
            ) from None
        raise
    return start_supervisor(paths, req.cwd)


def _make_files(req: LocalRequest, paths: statedir.AppPaths) -> None:
    os.mkdir(paths.state_dir, 0o700)
    for r in req.replicas:
        statedir.make_private_dirs(paths.replica_dir(r.role, r.id))
        # Created now, so a reader that comes before the replica starts finds them.
        for f in (r.stdout, r.stderr):
            os.close(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    write_json_atomic(paths.request, req.to_json())


def start_supervisor(paths: statedir.AppPaths, cwd: str) -> Child:
    """Start the app's supervisor and wait until it reports the replicas started."""
    rfd, wfd = os.pipe()
    try:
        child = _fork_supervisor(paths, wfd) or _exec_supervisor(paths, cwd, wfd)
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
        killpg(child.pid, signal.SIGKILL)
    code = child.wait(None)
    st = statedir.read_json(paths.state)
    cause = st.get("msg", "") if st is not None else ""
    if not cause:  # it died before it could say why: the last line of its log
        try:
            with open(paths.supervisor_log, errors="replace") as f:
                lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
        except OSError:
            lines = []
        cause = lines[-1] if lines else "no output"
        _record_failed(paths, f"the supervisor did not start the app: {cause}")
    raise SchedulerError(
        f"the local_cwd supervisor did not start the app (exit code {code}): {cause}; "
        f"its log: {paths.supervisor_log}"
    )


def _record_failed(paths: statedir.AppPaths, msg: str) -> None:
    """The app is FAILED with ``msg`` (``status`` and ``list`` say so, not SUBMITTED)."""
    st = {
        "app_id": os.path.basename(paths.app_dir),
        "state": "FAILED",
        "msg": msg,
        "supervisor": {"pid": 0, "start": None},
        "started_at": time.time(),
        "ended_at": time.time(),
        "replicas": [],
    }
    try:
        write_json_atomic(paths.state, st)
    except OSError:
        pass


def _fork_supervisor(paths: statedir.AppPaths, ready_fd: int) -> Child | None:
    """Fork the supervisor off this process: no interpreter start-up on the hot path.

    Only from a single-threaded process (a fork copies just the calling thread; another
    thread's locks would stay locked in the child forever): no other Python thread, and no
    native one either (e.g. a notebook that imported torch has an OpenMP pool). None: exec.
    """
    import threading

    if threading.active_count() != 1 or threading.current_thread() is not threading.main_thread():
        return None
    if not hasattr(os, "fork") or _native_threads() != 1:
        return None
    pid = os.fork()
    if pid == 0:  # the child: never returns
        from .supervisor import serve_forked

        serve_forked(paths.state_dir, ready_fd, paths.supervisor_log)
    return Child(pid)


def _native_threads() -> int:
    """Threads of this process, including ones Python does not know (a library's pool)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: trust the threading module
        return 1


def _exec_supervisor(paths: statedir.AppPaths, cwd: str, ready_fd: int) -> Child:
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
    return Child(proc.pid, proc)
