"""xrun: launch distributed PyTorch jobs.

``import xrun`` is kept cheap (no torch, no yaml, no docker): the runtime agent and the CLI's
start-up both pay for it. ``xrun.submit``, ``xrun.map_array``, ``xrun.Executor`` and
``xrun.Job`` (Python callables as jobs: :mod:`xrun.calls`) load on first use.
"""

from __future__ import annotations

from typing import Any

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xrun' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
