"""``ProcessFailure``: why one local worker failed, read from its exit and its error file.

The workers wing builds one per failed worker (``RunProcsResult.failures``); the agent's failure
report (``report.py``) orders them by time to name the root cause.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from .files import error_file_message, read_error_file

__all__ = ["ProcessFailure", "signal_name"]


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
