"""xrun runtime: the elastic agent and rendezvous that run inside every replica (torch-free).

The public names load on first use (``import xrun.runtime`` stays a bare-interpreter import)::

    from xrun.runtime import LaunchConfig, launch, record, start_processes
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import Agent, RunResult
    from .api import elastic_launch, launch, launch_agent
    from .config import LaunchConfig
    from .errors import (
        AgentFailedError,
        ChildFailedError,
        ErrorHandler,
        ProcessFailure,
        SignalException,
        record,
    )
    from .workers.api import PContext, RunProcsResult, Std, start_processes
    from .workers.logs_specs import DefaultLogsSpecs, LogsSpecs

# public name -> the submodule that defines it
_LAZY = {
    "Agent": "agent",
    "AgentFailedError": "errors",
    "ChildFailedError": "errors",
    "DefaultLogsSpecs": "workers.logs_specs",
    "ErrorHandler": "errors",
    "LogsSpecs": "workers.logs_specs",
    "SignalException": "errors",
    "RunResult": "agent",
    "elastic_launch": "api",
    "launch": "api",
    "launch_agent": "api",
    "LaunchConfig": "config",
    "ProcessFailure": "errors",
    "record": "errors",
    "PContext": "workers.api",
    "RunProcsResult": "workers.api",
    "Std": "workers.api",
    "start_processes": "workers.api",
}

__all__ = [  # spelled out (not sorted(_LAZY)) so linters see the re-exports
    "Agent",
    "AgentFailedError",
    "ChildFailedError",
    "DefaultLogsSpecs",
    "ErrorHandler",
    "LaunchConfig",
    "LogsSpecs",
    "PContext",
    "ProcessFailure",
    "RunProcsResult",
    "RunResult",
    "SignalException",
    "Std",
    "elastic_launch",
    "launch",
    "launch_agent",
    "record",
    "start_processes",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xrun.runtime' has no attribute {name!r}")
    value = getattr(import_module(f"xrun.runtime.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
