"""``ProcessFailure``: why one local worker failed, read from its exit and its error file.

Built the way torch's is, ``ProcessFailure(local_rank, pid, exitcode, error_file)``, with the
same derived fields (``error_file_data``, ``message``, ``timestamp``) and the same values where
there is no error file (``"<N/A>"``, ``{"message": "<NONE>"}``), so code written against
``torch.distributed.elastic.multiprocessing.errors.ProcessFailure`` reads it unchanged. A
malformed error file raises, as in torch; the workers wing builds its failures through
``from_exit``, which records such a file instead of failing the agent.

The agent's failure report (``report.py``) orders failures by time to name the root cause.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

from .files import parse_error_file

__all__ = ["NOT_AVAILABLE", "NO_ERROR_FILE_MESSAGE", "ProcessFailure", "signal_name"]

NOT_AVAILABLE = "<N/A>"
# torch's text for a worker that exited without an error file (its @record docs apply to ours).
NO_ERROR_FILE_MESSAGE = (
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
)


def signal_name(signum: int) -> str:
    """``"SIGKILL"`` for 9; ``"<N/A>"`` for a number that is no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return NOT_AVAILABLE


@dataclass
class ProcessFailure:
    """Why one local worker failed.

    ``exitcode`` is negative when a signal killed the process (``-9`` = SIGKILL).
    ``timestamp`` is the failure's time in epoch seconds: the error file's when the worker
    recorded one, else when the process was seen to exit; the earliest is the root cause.
    ``error_file`` is ``"<N/A>"`` when the worker left none.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    # When the agent saw the exit, in float epoch seconds (finer than ``timestamp``, to order
    # failures within one second); 0: now.
    exit_time: float = field(default=0.0, compare=False, repr=False)
    # When the agent last saw it running (0: unknown): a death without an error file happened
    # between then and exit_time. ``outside``: a signal the agent did not send killed it.
    seen_alive: float = field(default=0.0, compare=False, repr=False)
    outside: bool = field(default=False, compare=False, repr=False)
    error_file_data: dict[str, Any] = field(init=False)
    message: str = field(init=False)
    timestamp: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.exit_time:
            self.exit_time = time.time()
        parsed = parse_error_file(self.error_file)  # raises on a malformed file, as torch
        if parsed is None:
            self._no_error_file()
        else:
            self.error_file_data, self.message, stamp = parsed
            self.timestamp = stamp if stamp is not None else int(self.exit_time)
        if not self.message:
            if self.exitcode < 0:
                self.message = (
                    f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
                )
            else:
                self.message = NO_ERROR_FILE_MESSAGE
                # torch's marker for an exit without an error file (schedulers read it)
                self.error_file_data["errorTraits"] = {
                    "category": "system_terminated_error",
                    "retryability": "False",
                }

    def _no_error_file(self) -> None:
        self.error_file = NOT_AVAILABLE
        self.error_file_data = {"message": "<NONE>"}
        self.message = ""
        self.timestamp = int(self.exit_time)

    @classmethod
    def from_exit(
        cls, local_rank: int, pid: int, exitcode: int, error_file: str | None, exit_time: float
    ) -> ProcessFailure:
        """The failure of a process that exited with ``exitcode``. Unlike the constructor it
        never raises: a malformed error file (a worker killed while a non-atomic writer wrote
        it) is named in the message and the failure is kept."""
        try:
            return cls(local_rank, pid, exitcode, error_file or "", exit_time)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            f = cls(local_rank, pid, exitcode, "", exit_time)
            f.message = f"{f.message} (error file {error_file} is malformed: {exc})"
            return f

    def signal_name(self) -> str:
        """The killing signal's name, or ``"<N/A>"`` when the process exited on its own."""
        return signal_name(-self.exitcode) if self.exitcode < 0 else NOT_AVAILABLE

    def has_error_file(self) -> bool:
        return self.error_file != NOT_AVAILABLE

    def reason(self) -> str:
        """One line for the agents' messages: the error's last line, else how it ended."""
        # an error file's message, or the cause rootcause.py read in the worker's stderr
        explained = isinstance(self.error_file_data.get("message"), dict)
        if (self.has_error_file() or explained) and self.message:
            return self.message.splitlines()[-1]
        if self.exitcode < 0:
            return f"killed by {self.signal_name()} (exit code {self.exitcode})"
        return f"exited with code {self.exitcode}"
