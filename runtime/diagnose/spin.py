"""A rank that spins in a wait that never ends: the stall watchdog's spin rule (issue #31).

NCCL's collectives are asynchronous and CUDA's default wait spins at ~100 % of a CPU, so a rank
blocked in a hung collective is "work" for the CPU rule, and only the silent limit L would end
it. This module tells a spinning *collective* wait from work.

Only in the suspicious state (the attempt has shown no sign of life for ``S/2`` s, and its only
work is workers that use a CPU or stay runnable while reading and writing nothing) does the
agent read those workers' stacks *with their local variables* (``py-spy dump --locals``), at
most every ``max(check period, S/8)`` s; a job that prints, writes, beats or reads pays nothing.
A worker *spins in a wait* when

* its main thread's innermost Python frame is a collective wait: a function of
  ``torch/distributed/`` (``barrier``, ``all_reduce``, ``Work.wait`` wrappers, ...), or a
  source line that calls ``barrier(`` or ``.wait()``;
* and its main thread's stack (every frame's file, function, line, and every local variable's
  address and value) is the same in at least ``SAMPLES`` samples spanning at least ``S/2`` s.

GPU syncs (``torch.cuda.synchronize()``, ``loss.item()``, ``.cpu()``) are deliberately *not*
waits here: a healthy GPU-bound loop sits in them ~99 % of the time, and one with nothing that
changes between samples (a module-level loop, no step counter: measured on an H200 by
``benchmarks/gpu_checks.py``) was ended as a spin after ``S``. A hang that shows only there (an
NCCL collective that hung, seen at the next ``.item()``) meets the silent limit L instead, as a
long computation in C does; NCCL's own watchdog (10 min by default) ends it no later.

Standard library only; ``stacks`` loads when the first sample is taken.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from typing import Any

__all__ = ["SAMPLES", "Spin", "is_wait"]

SAMPLES = 3
# Collective waits only: a GPU sync (.item(), synchronize()) is where healthy GPU loops spend
# their time (module docstring).
_WAIT_FILE = re.compile(r"/torch/distributed/")
_WAIT_CALL = re.compile(r"\.wait\s*\(\s*\)|barrier\s*\(")
_MAX_SOURCE = 1 << 20  # a source file read for its line: the first MiB


class Spin:
    """Samples of the suspected workers; ``look`` on every check in the suspicious state,
    ``reset`` when it ends."""

    def __init__(self, stall_timeout: float, period: float) -> None:
        self.span = stall_timeout / 2
        self.interval = max(period, stall_timeout / 8)
        # py-spy's own bound per sample: it blocks the agent's loop
        self._timeout = min(5.0, max(1.0, self.interval))
        self._hist: dict[int, tuple[float, float, Any, int]] = {}  # pid: first, last, key, n
        self._next = 0.0
        self._sources: dict[str, list[str]] = {}
        self.samples = 0  # py-spy rounds taken (what the rule cost)

    def reset(self) -> None:
        self._hist.clear()
        self._next = 0.0

    def look(self, workers: Mapping[int, tuple[int, int]], now: float) -> None:
        """Sample ``workers`` (global rank -> (local rank, pid)) when the interval is up."""
        pids = {pid for _, pid in workers.values()}
        for pid in [p for p in self._hist if p not in pids]:
            del self._hist[pid]
        if now < self._next or not workers:
            return
        self._next = now + self.interval
        from .stacks import collect  # benchmark 1: only in the suspicious state

        self.samples += 1
        for r in collect(workers, self._timeout, local_vars=True).values():
            pid = int(r["pid"])
            key = self._key(_main_frames(r))
            old = self._hist.get(pid)
            if key is None:
                self._hist.pop(pid, None)
            elif old is not None and old[2] == key:
                self._hist[pid] = (old[0], now, key, old[3] + 1)
            else:
                self._hist[pid] = (now, now, key, 1)

    def confirmed(self, pids: Mapping[int, Any]) -> bool:
        """Every one of ``pids`` spins in a wait (see the top)."""
        for pid in pids:
            h = self._hist.get(pid)
            if h is None or h[3] < SAMPLES or h[1] - h[0] < self.span:
                return False
        return bool(pids)

    def _key(self, frames: list[dict[str, Any]]) -> Any:
        if not frames or not self.is_wait(frames[0]):
            return None
        return tuple(
            (f.get("file"), f.get("name"), f.get("line"), tuple(map(tuple, f.get("vars") or ())))
            for f in frames
        )

    def is_wait(self, frame: Mapping[str, Any]) -> bool:
        return is_wait(frame, self._sources)


def is_wait(frame: Mapping[str, Any], sources: dict[str, list[str]] | None = None) -> bool:
    """Whether the innermost Python frame ``frame`` waits for a GPU or a peer (see the top)."""
    path = str(frame.get("file", ""))
    if _WAIT_FILE.search(path):
        return True
    line = frame.get("line")
    if not isinstance(line, int) or line < 1:
        return False
    cache = {} if sources is None else sources
    if path not in cache:
        cache[path] = _source(path)
    lines = cache[path]
    return line <= len(lines) and bool(_WAIT_CALL.search(lines[line - 1].split("#", 1)[0]))


def _source(path: str) -> list[str]:
    # non-blocking and regular files only: a FIFO named like a source file never blocks the agent
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        return os.read(fd, _MAX_SOURCE).decode(errors="replace").splitlines()
    except OSError:
        return []
    finally:
        os.close(fd)


def _main_frames(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    for t in r.get("threads") or ():
        if t.get("main"):
            return list(t.get("frames") or ())
    return []
