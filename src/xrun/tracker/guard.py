"""Tracking never ends or blocks a job: each backend call of a job's run, guarded.

A backend that raises (a full disk, a read-only fsspec filesystem such as ``http://``, an
MLflow server that went away) or does not answer within :func:`timeout_s` is reported ONCE on
stderr, one line naming the backend and the error, and dropped for the rest of the process;
the other backends still get every write. What the dropped backend could not take (the
failed call and every later one) goes to a local fsspec store, :func:`unsent_root`, which the
same line names. A local fsspec root is written inline (its cost is a file write); every other
backend's call runs in a daemon thread the caller waits for at most :func:`timeout_s`, so a
server that accepts connections and never answers costs the job one timeout in all: the
backend is dropped at its first miss. See docs/tracking.md ("When a backend fails").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

TIMEOUT_ENV = "XRUN_TRACKER_TIMEOUT"
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 600.0
MESSAGE_CHARS = 300  # an MLflow error quotes whole responses: the line stays readable
_UNSENT_DIR = "tracker.unsent"  # under the job's log dir (PET_LOG_DIR)

# backend (by id) -> the name it was configured under (resolve.from_environ fills it)
_NAMES: dict[int, str] = {}


class TrackerTimeout(TimeoutError):
    """A backend call that did not return within the deadline."""


def timeout_s(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """The deadline of one backend call: ``XRUN_TRACKER_TIMEOUT`` seconds, else 5 s. A value
    that is no positive finite number of seconds up to 600 is ignored (this runs inside the
    job, where refusing it would end the job)."""
    try:
        value = float(env.get(TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if 0 < value <= MAX_TIMEOUT_S else DEFAULT_TIMEOUT_S


def within(deadline: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread, waited for at most ``deadline`` seconds:
    its result, its exception re-raised, or TrackerTimeout (the thread is left to finish or
    to die with the process; nothing waits for it)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import threading

    box: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            box.append((True, fn(*args, **kwargs)))
        except BaseException as e:  # handed to the caller, which decides
            box.append((False, e))

    worker = threading.Thread(target=target, name="xrun-tracker-call", daemon=True)
    worker.start()
    worker.join(deadline)
    if not box:
        raise TrackerTimeout(f"no answer within {deadline:g} s ({TIMEOUT_ENV})")
    ok, value = box[0]
    if ok:
        return value
    raise value


def is_local(backend: object) -> bool:
    """An fsspec backend on a local dir: written inline (a file write needs no deadline)."""
    from xrun.tracker.fsspec_backend import FsspecTracker, _Local

    return isinstance(backend, FsspecTracker) and type(backend._store) is _Local


def mask(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@host`` URL masked (M5)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import re

    return re.sub(r"(\w[\w+.-]*://[^/\s:@]*):[^/\s@]*@", r"\1:***@", text)


def label(backend: object) -> str:
    """``tracker NAME (WHERE)``, as the one stderr line names a backend."""
    name = _NAMES.get(id(backend), type(backend).__name__)
    where = getattr(backend, "root", None) or getattr(backend, "uri", None)
    return f"tracker {name}" + (f" ({mask(str(where))})" if where else "")


def describe(err: BaseException) -> str:
    """An error on one line, credentials masked, cut to MESSAGE_CHARS."""
    text = " ".join(str(err).split())
    if not isinstance(err, TrackerTimeout):
        text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    text = mask(text)
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def say(line: str) -> None:
    try:
        print(f"xrun.tracker: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed or full: the job goes on regardless
        pass


def unsent_root(failed: object) -> str | None:
    """Where what a dropped backend could not take is kept: ``$PET_LOG_DIR/tracker.unsent``
    (the job's own log dir, which local_cwd and slurm set), else the embedded default's root;
    None when that is the failed backend's own root (a full disk there takes nothing more)."""
    from xrun.contract import AGENT_LOG_DIR_ENV
    from xrun.tracker.fsspec_backend import default_root

    failed_root = getattr(failed, "root", None) if is_local(failed) else None
    log_dir = os.environ.get(AGENT_LOG_DIR_ENV)
    for root in ([os.path.join(log_dir, _UNSENT_DIR)] if log_dir else []) + [default_root()]:
        if os.path.abspath(root) != failed_root:
            return os.path.abspath(root)
    return None
