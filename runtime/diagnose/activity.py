"""Whether the workers work, as the kernel tells it: the stall watchdog's evidence besides
their lines, beats and timer requests (issue #31: a watchdog must never kill a healthy job).

Per worker and check, a few reads of ``/proc``: ``/proc/PID/stat`` (its state; the CPU time of
all its threads and of its reaped children), ``/proc/PID/io`` (``rchar``/``wchar``: bytes
passed to read/write calls, pipes, terminals and sockets written with write() included) and its
live children (``/proc/PID/task/PID/children``: a DataLoader's workers, a ``tar`` it runs;
their CPU time, recursively, at most ``_MAX_PROCS`` processes).

* **wrote**: a worker's ``wchar`` grew since the last check. A line of output is a write
  wherever it goes (a pipe, a terminal, docker's log driver, a tee'd file), and so is a
  checkpoint being saved.
* **working**: over the last ``WINDOW_S`` seconds its process tree used at least
  ``CPU_FRACTION`` of a CPU, read at least ``READ_BYTES``, or was runnable or in disk wait
  (state R/D) in most checks (a worker that wants the CPU of an overloaded host gets little of
  it, but stays runnable).

Measured on the 2-core test VM (torch 2.13, gloo): a rank blocked in ``all_reduce`` or
``barrier`` for ever and one sleeping in ``time.sleep`` both sit in state S, use 0 to 1 clock
tick (10 ms) a second and read and write nothing; the threshold (10 % of a CPU, 20 ticks over
2 s) is ten times that. ``import torch`` beside two CPU burners: 30-90 % of a CPU and MBs read.

Standard library only.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable

__all__ = ["CPU_FRACTION", "READ_BYTES", "WINDOW_S", "Activity", "proc_state"]

WINDOW_S = 2.0
CPU_FRACTION = 0.10
READ_BYTES = 64 * 1024
_MAX_PROCS = 64  # a worker's tree read per check, the worker included
_MAX_DEPTH = 3
try:
    _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):  # pragma: no cover - Linux always has it
    _TICK_S = 0.01


def proc_state(pid: int) -> str:
    """The one-letter state of ``/proc/PID/stat`` (``R``, ``S``, ``D``, ``T``, ``Z`` …), ""
    when it cannot be read."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields start after the last ')'
    fields = raw.rpartition(b")")[2].decode("ascii", "replace").split()
    return fields if len(fields) > 14 else None


def _children(pid: int) -> list[int]:
    # children forked by the main thread (DataLoader workers, subprocess.run from it)
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _io(pid: int) -> tuple[int, int]:
    rchar = wchar = 0
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"rchar:"):
                    rchar = int(line[6:])
                elif line.startswith(b"wchar:"):
                    wchar = int(line[6:])
    except (OSError, ValueError):
        pass  # not ours to read (another user's): CPU time and state still tell
    return rchar, wchar


class _Sample:
    __slots__ = ("busy", "cpu", "rchar", "t", "wchar")

    def __init__(self, t: float, cpu: float, rchar: int, wchar: int, busy: bool) -> None:
        self.t, self.cpu, self.rchar, self.wchar, self.busy = t, cpu, rchar, wchar, busy


def _sample(pid: int, t: float) -> _Sample | None:
    fields = _stat(pid)
    if fields is None or fields[0] in "ZX":
        return None
    cpu = 0.0
    busy = False
    todo: list[tuple[int, int, list[str] | None]] = [(pid, 0, fields)]
    seen = 0
    while todo and seen < _MAX_PROCS:
        p, depth, f = todo.pop()
        seen += 1
        if f is None:
            f = _stat(p)
            if f is None:
                continue
        # utime + stime (its threads) + cutime + cstime (its children it has waited for): a
        # child that ends between two checks moves its time from its own line to these
        cpu += sum(int(x) for x in f[11:15]) * _TICK_S
        busy = busy or f[0] in "RD"
        if depth < _MAX_DEPTH:
            todo.extend((c, depth + 1, None) for c in _children(p))
    rchar, wchar = _io(pid)
    return _Sample(t, cpu, rchar, wchar, busy)


class Activity:
    """The workers' recent samples; ``look`` once per check. After a look, ``spinners`` maps
    each worker that worked only by using a CPU or staying runnable (it read nothing, wrote
    nothing) to its share of a CPU in percent, and ``other_work`` says whether a worker worked
    otherwise (it read): what ``spin`` needs to tell a wait that spins from work."""

    def __init__(self) -> None:
        self._hist: dict[int, deque[_Sample]] = {}
        self.spinners: dict[int, int] = {}
        self.other_work = False

    def reset(self) -> None:
        """A new worker group: forget the old pids."""
        self._hist.clear()
        self.spinners = {}
        self.other_work = False

    def look(self, pids: Iterable[int], now: float) -> tuple[bool, bool]:
        """``(wrote, working)``: did any worker write since the last look (since its start, for
        a worker seen for the first time), and did any work over the last ``WINDOW_S`` seconds
        (False for a worker seen for the first time)."""
        wrote = working = False
        hist: dict[int, deque[_Sample]] = {}
        self.spinners, self.other_work = {}, False
        for pid in pids:
            cur = _sample(pid, now)
            if cur is None:
                continue
            h = self._hist.get(pid) or deque()
            # Seen for the first time: every byte it wrote since it started counts (its first
            # line may come before the agent's first look; a silent start-up writes nothing).
            this_wrote = cur.wchar > (h[-1].wchar if h else 0)
            wrote = wrote or this_wrote
            h.append(cur)
            # keep one sample at or before the window's start: the baseline of the deltas
            while len(h) > 2 and h[1].t <= now - WINDOW_S:
                h.popleft()
            hist[pid] = h
            how = _works(h) if len(h) > 1 else ""
            working = working or bool(how)
            if how == "read" or (how and this_wrote):
                self.other_work = True
            elif how:
                self.spinners[pid] = _cpu_percent(h)
        self._hist = hist  # workers that ended are dropped
        return wrote, working


def _works(h: deque[_Sample]) -> str:
    """How the worker worked over the window: "read", "cpu", "runnable", or "" (it did not)."""
    old, cur = h[0], h[-1]
    dt = cur.t - old.t
    if dt <= 0:
        return ""
    if cur.rchar - old.rchar >= READ_BYTES:
        return "read"
    if cur.cpu - old.cpu >= CPU_FRACTION * max(dt, WINDOW_S / 2):
        return "cpu"
    busy = sum(s.busy for s in list(h)[1:])
    return "runnable" if len(h) > 2 and 2 * busy > len(h) - 1 else ""


def _cpu_percent(h: deque[_Sample]) -> int:
    dt = h[-1].t - h[0].t
    return round(100 * (h[-1].cpu - h[0].cpu) / dt) if dt > 0 else 0
