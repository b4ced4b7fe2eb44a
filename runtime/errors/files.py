"""Worker error files: write, read and parse torchelastic's error-file document.

A worker that dies of an exception leaves its traceback in ``$TORCHELASTIC_ERROR_FILE`` so the
agent can report the root cause. The file uses torchelastic's JSON schema, so a file written by
torch's own ``torch.distributed.elastic.multiprocessing.errors.record`` reads the same way::

    {"message": {"message": "<ExcType>: <text>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<int epoch s>"}}}

Standard library only: the agent imports this module on its start-up path, and a function
worker imports it before the user's code runs.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = [
    "ERROR_FILE_ENV",
    "error_data",
    "error_file_message",
    "parse_error_file",
    "read_error_file",
    "write_error_file",
]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def error_data(exc: BaseException) -> dict[str, Any]:
    """The torchelastic error-file document for ``exc`` (its traceback included)."""
    import traceback  # benchmark 1: the error path only

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


def parse_error_file(path: str | None) -> tuple[dict[str, Any], str, int | None] | None:
    """``(document, message, timestamp)`` of the error file at ``path``, None when there is no
    such file. Strict, as torch's ``ProcessFailure``: a file that is not JSON, or lacks
    ``message`` (or, in the nested shape, ``extraInfo.timestamp``), raises ``ValueError``."""
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as fp:
        data = json.load(fp)
    msg = data.get("message") if isinstance(data, dict) else None
    if msg is None:
        raise ValueError(f"error file {path} has no 'message': not a torchelastic error file")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        if not isinstance(extra, dict) or "timestamp" not in extra:
            raise ValueError(f"error file {path} has no message.extraInfo.timestamp")
        return data, str(msg.get("message", "")), int(extra["timestamp"])
    stamp = data.get("timestamp")
    return data, str(msg), int(stamp) if stamp is not None else None
