"""Errors of the runtime: the workers' error files, why a worker failed, and the failure report.

* ``files.py``: ``@record`` and the torchelastic error file (write, read, its message);
* ``failure.py``: ``ProcessFailure``, one failed worker as the agent saw it;
* ``report.py``: ``AgentFailedError``/``ChildFailedError``, the failure summary and the
  agent's own error file.

Everything is re-exported here: ``from xrun.runtime.errors import record``.
"""

from __future__ import annotations

from .failure import ProcessFailure, signal_name
from .files import (
    ERROR_FILE_ENV,
    error_data,
    error_file_message,
    read_error_file,
    record,
    write_error_file,
)
from .report import (
    AgentFailedError,
    ChildFailedError,
    format_failures,
    root_cause,
    write_agent_error_file,
)

__all__ = [
    "ERROR_FILE_ENV",
    "AgentFailedError",
    "ChildFailedError",
    "ProcessFailure",
    "error_data",
    "error_file_message",
    "format_failures",
    "read_error_file",
    "record",
    "root_cause",
    "signal_name",
    "write_agent_error_file",
    "write_error_file",
]
