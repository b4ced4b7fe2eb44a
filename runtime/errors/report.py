"""The failure report: the exceptions a failed job raises, the summary it prints and the agent's
own error file.

The summary keeps torchrun's layout (title, the other failures, then the root cause, i.e. the
first observed failure), so people and log scrapers read both the same way. The agent's error
file is what its scheduler reads (``$TORCHELASTIC_ERROR_FILE`` of the agent itself, never a
worker's).

Standard library only; ``datetime``, ``json`` and ``socket`` load on the failure path alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any, Protocol

from .failure import ProcessFailure

__all__ = [
    "AgentFailedError",
    "ChildFailedError",
    "SignalException",
    "format_failures",
    "root_cause",
    "write_agent_error_file",
]

from .failure import NOT_AVAILABLE as _NA


class AgentFailedError(Exception):
    """The job failed on this node; ``str(e)`` is the summary the command line prints."""

    def __init__(self, message: str, exitcode: int = 1) -> None:
        super().__init__(message)
        self.exitcode = exitcode


class SignalException(AgentFailedError):
    """The agent was ended by a signal it handles (torch's ``SignalException``: ``sigval``);
    its workers got the signal first."""

    def __init__(self, msg: str, sigval: int) -> None:
        super().__init__(msg, exitcode=128 + int(sigval))
        self.sigval = signal.Signals(sigval)


class ChildFailedError(AgentFailedError):
    """Workers failed and the restarts are used up; ``failures`` maps global rank -> failure
    (torch's ``ChildFailedError``: same constructor, ``get_first_failure`` and ``format_msg``)."""

    def __init__(self, name: str, failures: Mapping[int, ProcessFailure]) -> None:
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure")
        self.name = name
        self.failures = dict(failures)
        super().__init__(format_failures(name, self.failures), exitcode=1)

    def get_first_failure(self) -> tuple[int, ProcessFailure]:
        """``(global rank, failure)`` of the root cause: the first observed failure."""
        rank = root_cause(self.failures)
        return rank, self.failures[rank]

    def format_msg(self) -> str:
        """The failure summary (what ``str(e)`` is)."""
        return format_failures(self.name, self.failures)


def root_cause(failures: Mapping[int, ProcessFailure]) -> int:
    """The global rank of the first observed failure.

    torch's order (the error file's timestamp, else when the exit was seen), except where it
    cannot tell: a worker killed from outside (kill -9, the OOM killer, a segfault) leaves no
    timestamp, only "dead since the agent last looked". On a busy host the agent may look
    once after both it and a peer that raised because of it ("connection closed by peer")
    are gone, and seeing the lower local rank first, named the peer (a stress run of
    tests/runtime/agent/test_warm.py). So among the failures that could have come first
    (that began no later than the earliest one surely ended), a kill from outside is the
    cause: a kill makes peers raise, a raise does not kill a peer from outside."""

    def key(r: int) -> tuple[float, float, int]:
        return (failures[r].timestamp, failures[r].exit_time, r)

    first = min(failures, key=key)
    ended = min(_latest(f) for f in failures.values())
    killed = [r for r, f in failures.items() if f.outside and _earliest(f) <= ended]
    return min(killed, key=key) if killed and not failures[first].outside else first


def _earliest(f: ProcessFailure) -> float:
    """The earliest time ``f`` can have happened: its error file's second, or, without one,
    when it was last seen running."""
    if f.has_error_file():
        return float(f.timestamp)
    return f.seen_alive or float(f.timestamp)


def _latest(f: ProcessFailure) -> float:
    """The latest time ``f`` can have happened: when its exit was seen (the end of the error
    file's second, if earlier)."""
    if f.has_error_file():
        return min(f.timestamp + 1.0, f.exit_time or f.timestamp + 1.0)
    return f.exit_time or float(f.timestamp)


def _format_failure(idx: int, rank: int, f: ProcessFailure, host: str) -> str:
    from datetime import datetime  # benchmark 1: a failure's summary only

    msg: str = f.message or _NA
    data = f.error_file_data
    if isinstance(data, dict) and isinstance(data.get("message"), dict):
        msg = data["message"].get("extraInfo", {}).get("py_callstack") or msg
    sig = f.signal_name()
    return (
        f"[{idx}]:\n"
        f"  time      : {datetime.fromtimestamp(f.timestamp).isoformat(sep='_')}\n"
        f"  host      : {host}\n"
        f"  rank      : {rank} (local_rank: {f.local_rank})\n"
        f"  exitcode  : {f.exitcode} (pid: {f.pid}){f' ({sig})' if sig != _NA else ''}\n"
        f"  error_file: {f.error_file or _NA}\n"
        f"  traceback : {msg.rstrip().replace(chr(10), chr(10) + '  ')}"
    )


def format_failures(name: str, failures: Mapping[int, ProcessFailure]) -> str:
    """The summary of ``failures`` (global rank -> failure) of the job called ``name``."""
    host = socket.getfqdn()
    title = f"{name} FAILED"
    root = root_cause(failures)
    parts = {r: _format_failure(i, r, f, host) for i, (r, f) in enumerate(sorted(failures.items()))}
    width = min(60, max([len(title)] + [len(x) for p in parts.values() for x in p.splitlines()]))
    others = [p for r, p in parts.items() if r != root] or ["  <NO_OTHER_FAILURES>"]
    return "\n".join(
        [
            "",
            "=" * width,
            title,
            "-" * width,
            "Failures:",
            *others,
            "-" * width,
            "Root Cause (first observed failure):",
            parts[root],
            "=" * width,
        ]
    )


class Outcome(Protocol):
    """What a failed run ended with (``agent.RunResult`` is one); read-only here."""

    @property
    def exitcode(self) -> int: ...
    @property
    def failures(self) -> Mapping[int, ProcessFailure]: ...
    @property
    def message(self) -> str: ...


def write_agent_error_file(path: str, result: Outcome) -> None:
    """The agent's own error file for its scheduler: the root cause's document (when the worker
    recorded one) with ``errorCode`` set to the worker's exit code, else the summary."""
    if result.failures:
        f = result.failures[root_cause(result.failures)]
        data = f.error_file_data
        if isinstance(data, dict) and isinstance(data.get("message"), dict):
            doc: dict[str, Any] = json.loads(json.dumps(data))
            doc["message"]["errorCode"] = f.exitcode
        else:
            doc = {
                "message": {
                    "message": f"ChildFailedError: {f.message}",
                    "extraInfo": {"py_callstack": result.message, "timestamp": str(f.timestamp)},
                    "errorCode": f.exitcode,
                }
            }
    else:
        doc = {
            "message": {
                "message": f"AgentFailedError: {result.message}",
                "extraInfo": {"py_callstack": result.message, "timestamp": str(int(time.time()))},
                "errorCode": result.exitcode,
            }
        }
    tmp = f"{path}.{os.getpid()}.tmp"
    # 0600: the root cause's traceback may quote data or paths meant for the user alone.
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fp:
        json.dump(doc, fp)
    os.replace(tmp, path)
