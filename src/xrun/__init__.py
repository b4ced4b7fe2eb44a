"""xrun: launch distributed PyTorch jobs.

``import xrun`` is kept cheap (no torch, no yaml, no docker): the runtime agent and the CLI's
start-up both pay for it. ``xrun.submit``, ``xrun.map_array``, ``xrun.Executor`` and
``xrun.Job`` (Python callables as jobs: :mod:`xrun.calls`) load on first use.
"""

# Not `from typing import TYPE_CHECKING`: typing itself costs `import xrun` several ms (the
# agent's start-up pays it); type checkers treat any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from xrun.calls.job import CallFailedError, DebugJob, Job
    from xrun.calls.submit import Executor, map_array, submit

    __all__ = ["CallFailedError", "DebugJob", "Executor", "Job", "map_array", "submit"]

__version__ = "0.1.0"

# name -> module: loaded by __getattr__ on first use, not at `import xrun`.
_LAZY = {
    "submit": "xrun.calls.submit",
    "map_array": "xrun.calls.submit",
    "Executor": "xrun.calls.submit",
    "Job": "xrun.calls.job",
    "DebugJob": "xrun.calls.job",
    "CallFailedError": "xrun.calls.job",
}


def __getattr__(name: str) -> "Any":  # quoted: no __future__ import, no typing at run time
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xrun' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
