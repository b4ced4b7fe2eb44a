"""The workers wing: start this node's worker processes, tee their output, watch them exit.

* ``api.py``: ``start_processes`` -> ``PContext`` (wait, signal, close), ``RunProcsResult``;
* ``streams.py``: ``Std``, which streams a redirect or tee applies to;
* ``logs_specs.py``: ``LogsSpecs``/``DefaultLogsSpecs``, where each worker's files go;
* ``numa.py``: ``--numa-binding``, the CPUs near a worker's GPU;
* ``worker.py``: the handle of one started process (shared by the two halves below);
* ``launch.py``: the starting half (log files, pipes, fork/exec of each worker);
* ``child.py``: what runs inside a worker between fork and the user's code;
* ``tee.py`` and ``inotify.py``: copy the workers' output to the console.

The public names (torch's ``torch.distributed.elastic.multiprocessing``): ``start_processes``,
``PContext``, ``RunProcsResult``, ``Std``, ``to_map``, ``LogsSpecs``, ``DefaultLogsSpecs``,
``LogsDest``, ``check_full_rank``. They load on first use: a function worker's process imports
``xrun.runtime.workers.child`` (multiprocessing finds its target there) and must not pay for
the rest of the wing before the user's code runs.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "start_processes": "api",
    "PContext": "api",
    "RunProcsResult": "api",
    "check_full_rank": "api",
    "Std": "streams",
    "to_map": "streams",
    "LogsSpecs": "logs_specs",
    "DefaultLogsSpecs": "logs_specs",
    "LogsDest": "logs_specs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xrun.runtime.workers' has no attribute {name!r}")
    value = getattr(import_module(f"xrun.runtime.workers.{module}"), name)
    globals()[name] = value
    return value
