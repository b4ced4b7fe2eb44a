"""Worker error files: the ``@record`` decorator, the file helpers and ``ProcessFailure``.

A worker that dies of an exception leaves its traceback in ``$TORCHELASTIC_ERROR_FILE`` so the
agent can report the root cause. The file uses torchelastic's JSON schema, so a file written by
torch's own ``torch.distributed.elastic.multiprocessing.errors.record`` reads the same way::

    {"message": {"message": "<ExcType>: <text>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<int epoch s>"}}}

Standard library only: the agent imports this module on its start-up path.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "ERROR_FILE_ENV",
    "ProcessFailure",
    "error_file_message",
    "read_error_file",
    "record",
    "write_error_file",
]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

_R = TypeVar("_R")


def error_data(exc: BaseException) -> dict[str, Any]:
    """The torchelastic error-file document for ``exc`` (its traceback included)."""
    import traceback  # json and traceback load on the error path only: the agent starts faster

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": tb, "timestamp": str(int(time.time()))},
        }
    }


def write_error_file(path: str, exc: BaseException) -> None:
    """Write ``exc`` to ``path`` in torchelastic's schema.

    Written to a temporary name and renamed, so an agent reading at the moment the worker dies
    sees either nothing or the whole document, never half of it. Mode 0600: a traceback can
    carry secrets from local variables' reprs.
    """
    import json

    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fp:
        json.dump(error_data(exc), fp)
    os.replace(tmp, path)


def read_error_file(path: str | None) -> dict[str, Any] | None:
    """The JSON document at ``path``; None when the path is unset, missing, unreadable or
    not a JSON object (a worker killed mid-write must not crash the agent)."""
    if not path:
        return None
    import json

    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            data = json.load(fp)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def error_file_message(data: dict[str, Any] | None) -> tuple[str, int | None]:
    """``(message, timestamp)`` from an error-file document; ``("", None)`` when absent.

    Two shapes exist: torchelastic's Python handler nests ``{"message": {"message", "extraInfo"}}``;
    its C++ handler writes ``{"message": "<text>", "timestamp": N}``.
    """
    if not data:
        return "", None
    msg = data.get("message")
    ts: Any = None
    if isinstance(msg, dict):
        text = msg.get("message", "")
        extra = msg.get("extraInfo")
        if isinstance(extra, dict):
            ts = extra.get("timestamp")
    else:
        text = msg if msg is not None else ""
        ts = data.get("timestamp")
    try:
        stamp: int | None = int(ts) if ts is not None else None
    except (TypeError, ValueError):
        stamp = None
    return str(text), stamp


def record(fn: Callable[..., _R]) -> Callable[..., _R | None]:
    """Decorate a worker's main function: an uncaught exception is written to
    ``$TORCHELASTIC_ERROR_FILE`` (when set) and re-raised, so the process still fails.

    Like torch's ``@record``: ``SystemExit(0)`` returns None (``runpy``-style mains end that
    way); other ``SystemExit`` codes pass through unrecorded, their exit code says it all.
    Example::

        from xrun.runtime import record

        @record
        def main() -> None:
            ...

        if __name__ == "__main__":
            main()
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _R | None:
        _enable_faulthandler()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 0:
                return None
            raise
        except Exception as exc:
            path = os.environ.get(ERROR_FILE_ENV)
            if path:
                write_error_file(path, exc)
            raise

    return wrapper


def _enable_faulthandler() -> None:
    # A segfault or a hang dumped by SIGABRT then shows every thread's Python stack on stderr.
    import faulthandler

    try:
        faulthandler.enable(all_threads=True)
    except (OSError, ValueError, RuntimeError):  # stderr closed or not a real file
        pass


def signal_name(signum: int) -> str:
    """``"SIGKILL"`` for 9; ``"<N/A>"`` for a number that is no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "<N/A>"


@dataclass
class ProcessFailure:
    """Why one local worker failed.

    ``exitcode`` is negative when a signal killed the process (``-9`` = SIGKILL).
    ``timestamp`` is the failure's time in epoch seconds: the error file's when the worker
    recorded one, else when the agent saw the process exit; the earliest is the root cause.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str | None
    error_file_data: dict[str, Any] | None
    timestamp: int
    message: str
    # Additive: the exit as seen by the agent, in float epoch seconds (finer than ``timestamp``,
    # to order failures that happen within the same second).
    exit_time: float = field(default=0.0, compare=False)

    @classmethod
    def from_exit(
        cls, local_rank: int, pid: int, exitcode: int, error_file: str | None, exit_time: float
    ) -> ProcessFailure:
        """Build the failure of a process that exited with ``exitcode``, reading its error file."""
        data = read_error_file(error_file)
        text, stamp = error_file_message(data)
        if not text:
            if exitcode < 0:
                text = f"Signal {-exitcode} ({signal_name(-exitcode)}) received by PID {pid}"
            else:
                text = f"Process exited with code {exitcode}"
        return cls(
            local_rank=local_rank,
            pid=pid,
            exitcode=exitcode,
            error_file=error_file if data is not None else None,
            error_file_data=data,
            timestamp=stamp if stamp is not None else int(exit_time),
            message=text,
            exit_time=exit_time,
        )

    def signal_name(self) -> str:
        """The killing signal's name, or ``"<N/A>"`` when the process exited on its own."""
        return signal_name(-self.exitcode) if self.exitcode < 0 else "<N/A>"
