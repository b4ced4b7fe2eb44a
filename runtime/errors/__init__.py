"""Errors of the runtime: the workers' error files, why a worker failed, and the failure report.

* ``files.py``: the torchelastic error file (write, read, parse);
* ``handler.py``: ``@record`` and ``ErrorHandler`` (a process's own error file);
* ``failure.py``: ``ProcessFailure``, one failed worker as the agent saw it;
* ``report.py``: ``AgentFailedError``/``ChildFailedError``/``SignalException``, the failure summary and the
  agent's own error file;
* ``rootcause.py`` and ``deaths.py``: the cause of a failure without an error file (the
  traceback in the worker's stderr file; why a signal killed it), loaded on the failure path.

Everything is re-exported here: ``from xrun.runtime.errors import record``.
"""

from __future__ import annotations

from .failure import NO_ERROR_FILE_MESSAGE, NOT_AVAILABLE, ProcessFailure, signal_name
from .files import (
    ERROR_FILE_ENV,
    error_data,
    error_file_message,
    parse_error_file,
    read_error_file,
    write_error_file,
)
from .handler import ErrorHandler, record
from .report import (
    AgentFailedError,
    ChildFailedError,
    SignalException,
    format_failures,
    root_cause,
    write_agent_error_file,
)

__all__ = [
    "ERROR_FILE_ENV",
    "AgentFailedError",
    "ChildFailedError",
    "ErrorHandler",
    "NOT_AVAILABLE",
    "NO_ERROR_FILE_MESSAGE",
    "ProcessFailure",
    "SignalException",
    "error_data",
    "error_file_message",
    "format_failures",
    "parse_error_file",
    "read_error_file",
    "record",
    "root_cause",
    "signal_name",
    "write_agent_error_file",
    "write_error_file",
]
