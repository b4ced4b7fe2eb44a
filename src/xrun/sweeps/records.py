"""Where a sweep is kept on disk, for every scheduler: how any shell finds it by its handle.

Layout (``$XDG_STATE_HOME/xrun/sweeps``, i.e. ``~/.local/state/xrun/sweeps``)::

    <scheduler>/<sweep_id>/sweep.json      the plan (trial table, AppDef(s)), run options,
                                           session, cwd; written once, at submit
    <scheduler>/<sweep_id>/state.json      local_cwd/docker: each trial's state, app id, exit
                                           code, host, times (the sweep supervisor writes it)
    <scheduler>/<sweep_id>/cancel/<trial>  a request to cancel one trial ("all": every trial)
    <scheduler>/<sweep_id>/supervisor.log  local_cwd/docker: the sweep supervisor's output

A handle ``SCHEDULER://SESSION/ID`` names a sweep when ``<SCHEDULER>/<ID>/sweep.json`` exists:
one ``stat``, so every ``xrun status``/``log``/``cancel`` can ask first. Dirs are 0700: the
plan may hold the job's env.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from xrun import xdg
from xrun.errors import UsageError

SPEC_FILE = "sweep.json"
STATE_FILE = "state.json"
CANCEL_DIR = "cancel"
LOG_FILE = "supervisor.log"
ALL = "all"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def root() -> str:
    return xdg.state_dir("sweeps")


def valid_id(sweep_id: str) -> bool:
    return bool(_ID_RE.match(sweep_id)) and ".." not in sweep_id


def sweep_dir(scheduler: str, sweep_id: str) -> str:
    return os.path.join(root(), scheduler, sweep_id)


def find(scheduler: str, sweep_id: str) -> str | None:
    """The sweep's dir, or None when this user has no such sweep."""
    if not valid_id(sweep_id) or not valid_id(scheduler):
        return None
    path = sweep_dir(scheduler, sweep_id)
    return path if os.path.isfile(os.path.join(path, SPEC_FILE)) else None


def check_trial(sweep_id: str, trial: int, size: int) -> None:
    """UsageError unless ``trial`` is one of the sweep's ``size`` trials."""
    if not 0 <= trial < size:
        raise UsageError(f"sweep {sweep_id} has trials 0..{size - 1}; no trial {trial}")


def create(scheduler: str, sweep_id: str, spec: dict[str, Any], replace: bool = False) -> str:
    """Make the sweep's dir and write its spec; FileExistsError when the id is taken, unless
    ``replace`` (a Slurm job id the cluster has given out again: the old record is stale)."""
    path = sweep_dir(scheduler, sweep_id)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    if replace and os.path.isdir(path):
        import shutil  # benchmark 5: every command reads records; only this writes

        shutil.rmtree(path)
    os.mkdir(path, 0o700)
    os.mkdir(os.path.join(path, CANCEL_DIR), 0o700)
    write_json(os.path.join(path, SPEC_FILE), spec)
    return path


def sweep_ids(scheduler: str) -> list[str]:
    """This user's sweeps on ``scheduler``, oldest first."""
    base = os.path.join(root(), scheduler)
    try:
        names = [n for n in os.listdir(base) if valid_id(n)]
    except FileNotFoundError:
        return []
    found = []
    for n in names:
        try:
            found.append((os.stat(os.path.join(base, n, SPEC_FILE)).st_mtime, n))
        except OSError:
            continue
    return [n for _, n in sorted(found)]


def write_json(path: str, data: Any) -> None:
    """Atomically (temp file + rename): readers see the old file or the new one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_spec(path: str) -> dict[str, Any]:
    spec = read_json(os.path.join(path, SPEC_FILE))
    if spec is None:
        raise FileNotFoundError(os.path.join(path, SPEC_FILE))
    return spec


def request_cancel(path: str, trial: int | None) -> None:
    """Record a cancel request (``None``: the whole sweep) where the supervisor looks."""
    name = ALL if trial is None else str(trial)
    fd = os.open(os.path.join(path, CANCEL_DIR, name), os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)


def cancel_requests(path: str) -> tuple[bool, set[int]]:
    """(the whole sweep was cancelled, the trials cancelled one by one)."""
    try:
        names = os.listdir(os.path.join(path, CANCEL_DIR))
    except FileNotFoundError:
        return False, set()
    return ALL in names, {int(n) for n in names if n.isdigit()}
