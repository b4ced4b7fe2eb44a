"""``--event-log-handler``: torchrun's event records, as JSON lines on a named handler.

torchrun's agent records, through the handler ``--event-log-handler`` names, the same events
as torch 2.13's (``tests/fixtures/torchrun/events-2.13.json`` holds a recording; the test
replays it): per rendezvous round ``RENDEZVOUS`` and ``ASSIGN_WORKER_RANKS`` (source AGENT,
with ``duration_ms``), ``START`` per worker, and at the end each worker's final state
(``SUCCEEDED``, ``FAILED`` with its exit code, pid and error, or ``TERMINATED``) and the
agent's. Handlers: ``null`` (the default: nothing), ``console`` (one JSON line per event on
stderr, as torch's) or ``dynamic_rendezvous`` (nothing, as torch's). Each line has torch's
``Event`` fields, ``name``, ``source``, ``timestamp``, ``metadata``, and the metadata torch's
keys (``run_id``, ``global_rank``, ``group_rank``, ``worker_id``, ``role``, ``hostname``,
``state``, ``total_run_time``, ``rdzv_backend``, ``raw_error``, ``metadata`` as a JSON string,
``agent_restarts``, ``duration_ms``). One difference on purpose: ``timestamp`` is the time in
epoch milliseconds (torch 2.13 writes 0), and a failed run's agent event says FAILED (torch's
says SUCCEEDED).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["EventLog"]


class _Failure(Protocol):
    pid: int
    exitcode: int
    error_file_data: dict[str, Any]


class _Result(Protocol):
    exitcode: int

    @property
    def failures(self) -> Mapping[int, Any]: ...  # by global rank: each a _Failure


def entry_point_name(entrypoint: Callable[..., Any] | str) -> str:
    """What torch's events call the entry point: a binary's file name, a function's name."""
    if isinstance(entrypoint, str):
        return os.path.basename(entrypoint)
    return str(getattr(entrypoint, "__qualname__", entrypoint))


class EventLog:
    """One agent's events; every method does nothing unless the handler is ``console``."""

    def __init__(
        self, handler: str, run_id: str, role: str, host: str, backend: str, entry_point: str
    ) -> None:
        self.enabled = handler == "console"
        self._base = {"run_id": run_id, "role": role, "hostname": host, "rdzv_backend": backend}
        self._entry_point = entry_point
        self._t0 = time.monotonic()
        # The current round's world: (group_rank, group_world_size, world_size, rank_offset).
        self._group: tuple[int | None, int | None, int, int] = (None, None, 0, 0)
        self._pids: dict[int, int] = {}  # local rank -> pid of the current round's workers

    def _emit(
        self,
        state: str,
        source: str,
        restarts: int,
        *,
        rank: int | None = None,
        worker: dict[str, Any] | None = None,
        duration_ms: float | None = None,
        raw_error: str | None = None,
        worker_id: str | None = None,
    ) -> None:
        group_rank, group_world_size, _, _ = self._group
        inner: dict[str, Any] = {"group_world_size": group_world_size}
        inner["entry_point"] = self._entry_point
        inner.update(worker or {})
        md = {
            "run_id": self._base["run_id"],
            "global_rank": rank,
            "group_rank": group_rank,
            "worker_id": worker_id,
            "role": self._base["role"],
            "hostname": self._base["hostname"],
            "state": state,
            "total_run_time": int(time.monotonic() - self._t0),
            "rdzv_backend": self._base["rdzv_backend"],
            "raw_error": raw_error,
            "metadata": json.dumps(inner),
            "agent_restarts": restarts,
            "duration_ms": duration_ms,
        }
        doc = {
            "name": f"torchelastic.worker.status.{state}",
            "source": source,
            "timestamp": int(time.time() * 1000),
            "metadata": md,
        }
        print(json.dumps(doc), file=sys.stderr, flush=True)

    # -- the points of the agent's loop -------------------------------------------------------

    def rendezvous(self, duration_s: float, restarts: int) -> None:
        """A round is agreed: recorded with the group of the round before (torch's order)."""
        if self.enabled:
            self._emit("RENDEZVOUS", "AGENT", restarts, duration_ms=duration_s * 1000)

    def ranks_assigned(
        self,
        duration_s: float,
        restarts: int,
        group: tuple[int, int, int, int],
    ) -> None:
        if self.enabled:
            self._emit("ASSIGN_WORKER_RANKS", "AGENT", restarts, duration_ms=duration_s * 1000)
        self._group = group

    def started(self, pids: Mapping[int, int], restarts: int) -> None:
        self._pids = dict(pids)
        if self.enabled:
            for lr in sorted(pids):
                self._worker("START", lr, restarts, None)

    def _worker(self, state: str, lr: int, restarts: int, failure: _Failure | None) -> None:
        _, _, world_size, offset = self._group
        worker = {
            "local_rank": [lr],
            "role_rank": [offset + lr],
            "role_world_size": [world_size],
            "exit_code": [failure.exitcode if failure else None],
            "worker_pid": [failure.pid if failure else None],
        }
        raw = json.dumps(failure.error_file_data) if failure else None
        pid = self._pids.get(lr)
        self._emit(
            state,
            "WORKER",
            restarts,
            rank=offset + lr,
            worker=worker,
            raw_error=raw,
            worker_id=None if pid is None else str(pid),
        )

    def finished(self, result: _Result, restarts: int) -> None:
        """Each worker's final state, then the agent's."""
        if not self.enabled:
            return
        offset = self._group[3]
        for lr in sorted(self._pids):
            failure = result.failures.get(offset + lr)
            if failure is not None:
                state = "FAILED"
            else:
                state = "SUCCEEDED" if result.exitcode == 0 else "TERMINATED"
            self._worker(state, lr, restarts, failure)
        self._emit("SUCCEEDED" if result.exitcode == 0 else "FAILED", "AGENT", restarts)
