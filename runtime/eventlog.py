"""``--event-log-handler``: torchrun's event records, as JSON lines on a named handler.

torchrun logs an event per worker (its final state) and one for the agent through the handler
named by ``--event-log-handler``: ``null`` (the default: nothing), ``console`` (one JSON line
per event on stderr) or ``dynamic_rendezvous`` (nothing, as torch's). The lines have torch's
``Event`` fields: ``name``, ``source``, ``timestamp`` (ms), ``metadata``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

__all__ = ["record_run"]


class _Result(Protocol):
    exitcode: int
    return_values: dict[int, Any]
    failures: dict[int, Any]


def _event(name: str, source: str, metadata: dict[str, Any]) -> str:
    import json

    doc = {
        "name": name,
        "source": source,
        "timestamp": int(time.time() * 1000),
        "metadata": metadata,
    }
    return json.dumps(doc)


def record_run(handler: str, result: _Result, entrypoint: str, config: Any) -> None:
    """The workers' final states and the agent's, on ``handler`` (nothing for ``null``)."""
    if handler != "console":
        return
    state = "SUCCEEDED" if result.exitcode == 0 else "FAILED"
    ranks = sorted({*result.return_values, *result.failures})
    for rank in ranks:
        failure = result.failures.get(rank)
        worker_state = (
            "FAILED"
            if failure is not None
            else ("SUCCEEDED" if state == "SUCCEEDED" else "TERMINATED")
        )
        md = {
            "run_id": config.run_id,
            "role": config.role,
            "global_rank": rank,
            "state": worker_state,
            "entry_point": entrypoint,
            "exit_code": failure.exitcode if failure is not None else None,
            "worker_pid": failure.pid if failure is not None else None,
        }
        print(_event(f"torchelastic.worker.status.{worker_state}", "WORKER", md), file=sys.stderr)
    md = {"run_id": config.run_id, "role": config.role, "state": state, "entry_point": entrypoint}
    print(_event(f"torchelastic.worker.status.{state}", "AGENT", md), file=sys.stderr, flush=True)
