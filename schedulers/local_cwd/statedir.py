"""Where a local_cwd app lives on disk, and how any process finds and reads it.

Layout of one app (``log_dir`` is the run option; see :func:`default_log_dir`)::

    <log_dir>/<app_id>/                       0700
        <role>/<replica>/stdout.log           0600, the replica's stdout
        <role>/<replica>/stderr.log           0600
        <role>/<replica>/error.json           TORCHELASTIC_ERROR_FILE (written by the replica)
        <role>/<replica>/exit.json            XRUN_EXIT_RECORD: the runtime agent's exit code
        .xrun/request.json                    what to run (written by schedule())
        .xrun/state.json                      pids, start times, exit codes, states (supervisor)
        .xrun/supervisor.log                  the supervisor's own output (normally empty)

Role names cannot start with ``.``, so ``.xrun`` never clashes with a role.

An index in a fixed per-user place, ``$XDG_STATE_HOME/xrun/local_cwd/index/<app_id>`` (a
symlink to the app's dir), lets ``status``/``log``/``cancel``/``list`` find an app whatever
``log_dir`` it was given, from any process and any cwd. Without its index entry (the state
dir was deleted) a running app is still found through its processes' ``XRUN_APP_DIR`` (see
:mod:`.procs`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from xrun.errors import SchedulerError, UsageError
from xrun.record import Value
from xrun.specs import AppState
from xrun.xdg import state_dir

from .supervisor import LOG_FILE, REQUEST_FILE, STATE_FILE

STATE_SUBDIR = ".xrun"
# What an app id looks like (see request.make_app_id); anything else cannot name an app dir,
# which also keeps ids like "../x" from walking out of the index.
_APP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def default_log_dir() -> str:
    """``$XDG_STATE_HOME/xrun/local_cwd/logs`` (``~/.local/state/xrun/local_cwd/logs``)."""
    return state_dir("local_cwd", "logs")


def index_dir() -> str:
    return state_dir("local_cwd", "index")


def valid_app_id(app_id: str) -> bool:
    return bool(_APP_ID_RE.match(app_id)) and ".." not in app_id


class AppPaths(Value):
    """The files of one app, from its directory. A plain value class: a dataclass costs every
    local run (benchmarks 1 and 5) ~0.4 ms to make."""

    app_dir: str

    @property
    def state_dir(self) -> str:
        return os.path.join(self.app_dir, STATE_SUBDIR)

    @property
    def request(self) -> str:
        return os.path.join(self.state_dir, REQUEST_FILE)

    @property
    def state(self) -> str:
        return os.path.join(self.state_dir, STATE_FILE)

    @property
    def supervisor_log(self) -> str:
        return os.path.join(self.state_dir, LOG_FILE)

    def replica_dir(self, role: str, replica_id: int) -> str:
        return os.path.join(self.app_dir, role, str(replica_id))

    def log_file(self, role: str, replica_id: int, stream: str) -> str:
        return os.path.join(self.replica_dir(role, replica_id), f"{stream}.log")

    def error_file(self, role: str, replica_id: int) -> str:
        return os.path.join(self.replica_dir(role, replica_id), "error.json")

    def exit_record(self, role: str, replica_id: int) -> str:
        return os.path.join(self.replica_dir(role, replica_id), "exit.json")


def make_private_dirs(path: str) -> None:
    """``mkdir -p`` with mode 0700 for every dir created (logs may hold secrets)."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def register(app_id: str, app_dir: str) -> None:
    """Add ``app_id -> app_dir`` to the per-user index (a symlink: atomic, one syscall);
    UsageError naming the index dir when it is not writable."""
    idx = index_dir()
    link = os.path.join(idx, app_id)
    tmp = f"{link}.{os.getpid()}.tmp"
    try:
        make_private_dirs(idx)
        os.symlink(os.path.abspath(app_dir), tmp)
        os.replace(tmp, link)
    except OSError as e:
        raise UsageError(
            f"cannot write local_cwd's app index {idx}: {e.strerror or e}; it lives in the "
            "state dir ($XDG_STATE_HOME/xrun, default ~/.local/state/xrun): make that dir "
            "writable, or point XDG_STATE_HOME at a writable dir"
        ) from None


def unregister(app_id: str) -> None:
    try:
        os.unlink(os.path.join(index_dir(), app_id))
    except FileNotFoundError:
        pass


def find(app_id: str) -> AppPaths | None:
    """The app's paths, or None when no app of this user has that id. Without an index entry,
    a running app's processes name its dir (the index may have been deleted)."""
    if not valid_app_id(app_id):
        return None
    candidates = [os.path.join(index_dir(), app_id), os.path.join(default_log_dir(), app_id)]
    for path in candidates:
        paths = AppPaths(os.path.realpath(path))
        if os.path.isfile(paths.request):
            return paths
    from .procs import app_processes

    for app_dir in sorted(set(app_processes(app_id=app_id).values())):
        paths = AppPaths(app_dir)
        if os.path.isfile(paths.request):
            return paths
    return None


def indexed_app_ids() -> list[str]:
    try:
        names = os.listdir(index_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if valid_app_id(n) and not n.endswith(".tmp"))


def read_json(path: str) -> dict[str, Any] | None:
    """The file's JSON object, or None when it does not exist (yet) or is not one (a file
    truncated by a full disk reads as missing, not as a crash)."""
    data = _load(path)
    return data if isinstance(data, dict) else None


def _load(path: str) -> object:
    """The file's JSON value; None when it does not exist or is no JSON (half-written)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


class DamagedRecord(SchedulerError):
    """An app's record is valid JSON of the wrong shape (edited by hand, written by another
    version): exit 1 and one line naming the file, never a KeyError deep in ``status``."""

    def __init__(self, path: str, why: str) -> None:
        app_dir = os.path.dirname(os.path.dirname(path))
        super().__init__(
            f"local_cwd's record {path} is damaged ({why}); `rm -r {app_dir}` forgets the app"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(
    path: str, where: str, data: object, fields: dict[str, tuple[type, ...]]
) -> dict[str, Any]:
    """``data`` is a dict whose ``fields`` have these types (a missing field counts as
    None); DamagedRecord naming the first that does not."""
    if not isinstance(data, dict):
        raise DamagedRecord(path, f"{where} is {type(data).__name__}, not an object")
    for name, types in fields.items():
        value = data.get(name)
        ok = any(
            _is_int(value)
            if t is int
            else value is None
            if t is type(None)
            else isinstance(value, t)
            for t in types
        )
        if not ok:
            raise DamagedRecord(path, f"{where}{name} is {shown_type(value)}")
    return data


def shown_type(value: object) -> str:
    return "missing" if value is None else f"the {type(value).__name__} {value!r:.40}"


_STATES = frozenset(s.name for s in AppState) | {"STOPPING"}


def read_request(path: str) -> dict[str, Any] | None:
    """``request.json`` (None while it does not exist), its shape checked: what ``status``,
    ``log`` and ``list`` read from it (DamagedRecord otherwise)."""
    req = _load(path)
    if req is None:
        return None
    req = _check_fields(path, "", req, {"app": (dict,), "replicas": (list,)})
    for i, r in enumerate(req["replicas"]):
        _check_fields(path, f"replicas[{i}].", r, {"role": (str,), "id": (int,)})
    tolerate = req.get("tolerate", {})
    if not isinstance(tolerate, dict) or not all(_is_int(v) for v in tolerate.values()):
        raise DamagedRecord(path, f"tolerate is {shown_type(tolerate)}")
    return req


def read_state(path: str) -> dict[str, Any] | None:
    """``state.json`` (None while it does not exist), its shape checked (DamagedRecord)."""
    st = _load(path)
    if st is None:
        return None
    st = _check_fields(path, "", st, {"state": (str,), "supervisor": (dict,), "replicas": (list,)})
    if st["state"] not in _STATES:
        raise DamagedRecord(path, f"state {st['state']!r:.40} is no app state")
    _check_fields(
        path, "supervisor.", st["supervisor"], {"pid": (int,), "start": (int, type(None))}
    )
    if not isinstance(st.get("msg", ""), str):
        raise DamagedRecord(path, f"msg is {shown_type(st['msg'])}")
    replica = {
        "role": (str,),
        "id": (int,),
        "pid": (int, type(None)),  # None until the replica started
        "start": (int, type(None)),
        "exit_code": (int, type(None)),
        "state": (str,),
    }
    for i, r in enumerate(st["replicas"]):
        _check_fields(path, f"replicas[{i}].", r, replica)
    return st


def read_error_summary(path: str) -> str:
    """The message of a torchelastic-style error file (``{"message": {"message": ...}}``).

    "" when the replica wrote none (it exited without the runtime's error handler).
    """
    try:
        data = read_json(path)
    except (OSError, ValueError):  # half-written by a replica that was killed mid-write
        return ""
    if not data:
        return ""
    message = data.get("message", data)
    if isinstance(message, dict):
        return str(message.get("message") or json.dumps(message))
    return str(message)
