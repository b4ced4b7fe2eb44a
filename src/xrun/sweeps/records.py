"""Where a sweep is kept on disk, for every scheduler: how any shell finds it by its handle.

Layout (``$XDG_STATE_HOME/xrun/sweeps``, i.e. ``~/.local/state/xrun/sweeps``)::

    <scheduler>/<sweep_id>/sweep.json      the plan (trial table, AppDef(s)), run options,
                                           session, cwd; written once, at submit
    <scheduler>/<sweep_id>/state.json      local_cwd/docker: each trial's state, app id, exit
                                           code, host, times (the sweep supervisor writes it)
    <scheduler>/<sweep_id>/cancel/<trial>  a request to cancel one trial ("all": every trial)
    <scheduler>/<sweep_id>/ended/<trial>   when the trial was first seen ended (first_end)
    <scheduler>/<sweep_id>/supervisor.log  local_cwd/docker: the sweep supervisor's output

A handle ``SCHEDULER://SESSION/ID`` names a sweep when ``<SCHEDULER>/<ID>/sweep.json`` exists:
one ``stat``, so every ``xrun status``/``log``/``cancel`` can ask first. Dirs are 0700: the
plan may hold the job's env.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from typing import Any

from xrun import xdg
from xrun.errors import SchedulerError, UsageError
from xrun.specs import AppState

SPEC_FILE = "sweep.json"
STATE_FILE = "state.json"
SUPERVISOR_FILE = "supervisor.json"
CANCEL_DIR = "cancel"
ENDED_DIR = "ended"
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


def first_end(path: str, trial: int) -> float:
    """When trial ``trial`` was first seen ended, by whoever saw it first: the supervisor, or a
    status that asked the trial's app before the supervisor's next round. The first one writes
    ``ended/<trial>`` (temp file + link: it appears whole or not at all); everyone after reads
    it, so the duration a table shows never changes once the trial has ended."""
    folder = os.path.join(path, ENDED_DIR)
    final = os.path.join(folder, str(trial))
    try:
        with open(final) as f:
            return float(f.read())
    except (OSError, ValueError):
        pass
    now = time.time()
    tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(repr(now))
        os.link(tmp, final)
    except FileExistsError:  # another reader saw it first: its time wins
        try:
            with open(final) as f:
                now = float(f.read())
        except (OSError, ValueError):
            pass
    except OSError:  # a full disk, no hard links: our own time, as before (never a failure)
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return now


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class DamagedRecord(SchedulerError):
    """A sweep's record is valid JSON of the wrong shape (edited by hand, written by another
    version): exit 1 and one line naming the file, never a KeyError deep in ``status``."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"the sweep's record {path} is damaged ({why}); `rm -r {os.path.dirname(path)}` "
            "forgets the sweep"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    return "missing" if value is None else f"the {type(value).__name__} {value!r:.40}"


# What a field may hold: a type, "int" (no bool), or None (may be missing / null).
Kind = type | str | None


def check_fields(path: str, where: str, data: object, fields: dict[str, tuple[Kind, ...]]) -> Any:
    """``data`` is an object whose ``fields`` hold one of their kinds; DamagedRecord naming
    the first that does not. Returns ``data``."""
    if not isinstance(data, dict):
        raise DamagedRecord(path, f"{where or 'the record'} is {_shown(data)}, not an object")
    for name, kinds in fields.items():
        value = data.get(name)
        if not any(
            (value is None)
            if k is None
            else _is_int(value)
            if k == "int"
            else (isinstance(k, type) and isinstance(value, k))
            for k in kinds
        ):
            raise DamagedRecord(path, f"{where}{name} is {_shown(value)}")
    return data


def _load(path: str) -> object:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_spec(path: str) -> dict[str, Any]:
    """``sweep.json``, its common shape checked (the plan: name, params, trials)."""
    file = os.path.join(path, SPEC_FILE)
    spec: Any = _load(file)
    if spec is None:
        if os.path.lexists(file):  # there, but unreadable, not JSON, or JSON's null
            raise DamagedRecord(file, "it holds no JSON object")
        raise FileNotFoundError(file)
    spec = check_fields(file, "", spec, {"plan": (dict,)})
    plan = check_fields(file, "plan.", spec["plan"], {"name": (str,), "params": (list,)})
    trials = plan.get("trials")
    if not isinstance(trials, list) or not trials:
        raise DamagedRecord(file, f"plan.trials is {_shown(trials)}, not a list of trials")
    for i, t in enumerate(trials):
        if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
            raise DamagedRecord(file, f"plan.trials[{i}] is {_shown(t)}")
    if not all(isinstance(p, str) for p in plan["params"]):
        raise DamagedRecord(file, f"plan.params is {_shown(plan['params'])}")
    return spec


_STATES = frozenset(s.name for s in AppState)
_TRIAL: dict[str, tuple[Kind, ...]] = {
    "state": (str,),
    "app_id": (str,),
    "exit_code": ("int", None),
    "host": (str,),
    "started": (int, float, None),
    "ended": (int, float, None),
    "msg": (str,),
}


def load_state(path: str, size: int) -> dict[str, Any] | None:
    """``state.json`` of a sweep of ``size`` trials (None until the first is written), its
    shape checked: one record per trial, each with a known state."""
    file = os.path.join(path, STATE_FILE)
    state: Any = _load(file)
    if state is None:
        return None
    state = check_fields(file, "", state, {"trials": (list,), "msg": (str, None)})
    if len(state["trials"]) != size:
        raise DamagedRecord(file, f"{len(state['trials'])} trial records for {size} trials")
    for i, t in enumerate(state["trials"]):
        check_fields(file, f"trials[{i}].", t, _TRIAL)
        if t["state"] not in _STATES:
            raise DamagedRecord(file, f"trials[{i}].state {t['state']!r:.40} is no app state")
    return dict(state)


def load_supervisor(path: str) -> dict[str, Any] | None:
    """``supervisor.json`` (pid and start time of the sweep's supervisor), or None."""
    file = os.path.join(path, SUPERVISOR_FILE)
    sup: Any = _load(file)
    if sup is None:
        return None
    return dict(check_fields(file, "", sup, {"pid": ("int",), "start": ("int", None)}))


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
