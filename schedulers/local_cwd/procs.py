"""A local_cwd app's processes as the kernel knows them, whatever its files say.

Every replica gets ``XRUN_APP_DIR`` (:data:`xrun.contract.APP_DIR_ENV`) in its environment and
every process it starts inherits it (the runtime agent's workers, in sessions of their own,
too), so ``/proc/PID/environ`` tells which processes belong to an app. ``cancel`` uses it to
see every process end before it reports success, and to stop an app whose state dir was
deleted; ``status`` to say that such an app still runs. Linux only (no ``/proc``: nothing is
found, and the callers fall back on the pids in ``state.json``).
"""

from __future__ import annotations

import os
import signal
import time

from xrun.contract import APP_DIR_ENV
from xrun.procs import is_alive, proc_start_time, signal_if_same

from ..logs import POLL_S

_KEY = APP_DIR_ENV.encode() + b"="

# (pid, start time): a process, told apart from a later one that reuses its pid.
Proc = tuple[int, int | None]


def _app_dir_of(pid: str) -> str | None:
    """The ``XRUN_APP_DIR`` a process started with, or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:  # gone, a zombie's (empty), or not ours to read
        return None
    at = env.find(b"\0" + _KEY)
    if at < 0:
        if not env.startswith(_KEY):
            return None
        at = -1
    start = at + 1 + len(_KEY)
    end = env.find(b"\0", start)
    return env[start : end if end >= 0 else len(env)].decode(errors="replace")


def app_processes(app_dir: str | None = None, app_id: str | None = None) -> dict[Proc, str]:
    """This user's processes of the app with dir ``app_dir`` (or, without it, of any app dir
    named ``app_id``): ``(pid, start) -> app dir``. Never this process itself."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    me, uid = os.getpid(), os.getuid()
    found: dict[Proc, str] = {}
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
        except OSError:
            continue
        value = _app_dir_of(name)
        if value is None:
            continue
        if (app_dir is not None and value == app_dir) or (
            app_dir is None and os.path.basename(value) == app_id
        ):
            start = proc_start_time(int(name))
            if start is not None:  # None: exited meanwhile
                found[(int(name), start)] = value
    return found


def stop(procs: list[Proc], grace: float) -> list[Proc]:
    """SIGTERM each process, up to ``grace`` seconds for all to end, SIGKILL the rest; the ones
    still there a few seconds after that (uninterruptible, or not ours to kill)."""
    _signal(procs, signal.SIGTERM)
    left = _wait_gone(procs, grace)
    if left:
        _signal(left, signal.SIGKILL)
        left = _wait_gone(left, 5.0)
    return left


def _signal(procs: list[Proc], sig: int) -> None:
    for pid, start in procs:
        # never a later process that reuses the pid (through a pidfd where there is one)
        signal_if_same(pid, start, sig)


def _wait_gone(procs: list[Proc], timeout: float) -> list[Proc]:
    deadline = time.monotonic() + timeout
    left = [p for p in procs if is_alive(*p)]
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = [p for p in left if is_alive(*p)]
    return left


def group_alive(pgid: int | None, start: int | None) -> bool:
    """Does the process group a replica led (its pid, start time ``start``) still have
    members? While it does the kernel never hands that pid to a new process, so a live
    process with the pid but another start time leads a group that is not ours."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = proc_start_time(pgid)
    return now is None or start is None or now == start


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group that may be gone already, or no longer ours."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
