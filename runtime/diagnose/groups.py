"""Ranks grouped by where their main thread is, and the text people read.

In a hung collective every healthy rank waits at the same line and the culprit is elsewhere:
ranks whose main-thread stacks are identical form one group, and the smallest group (the odd
one out) comes first; of two groups of one size, the one in the job's own code comes before one
waiting inside a library. A group is named by *where* it is: the innermost frame's function at the
innermost frame of the job's own code (not the standard library's, not site-packages'), e.g.
``all_reduce (train.py:42)`` for a rank blocked in torch's ``all_reduce`` called on line 42.

Input: global rank -> a rank's stacks as ``stacks.collect`` returns them (plus ``host``).
Standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Group", "format_groups", "group", "headline", "rank_list", "where"]

# A frame in the interpreter's library or an installed package: not the job's own code.
_LIBRARY = re.compile(r"/lib(64)?/python3[.\d]*/|/site-packages/|/dist-packages/|^<frozen ")


@dataclass
class Group:
    """Ranks with the same main-thread stack (or the same reason for having none)."""

    ranks: list[int]
    where: str  # "all_reduce (train.py:42)", or the error line
    main: list[dict[str, Any]] = field(default_factory=list)  # frames, innermost first
    error: str = ""
    spinning: int = -1  # every rank spins in a wait (the stall watchdog): the least % CPU


def _main_frames(r: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    for t in r.get("threads") or ():
        if t.get("main"):
            return list(t.get("frames") or ())
    return None


def where(frames: list[dict[str, Any]]) -> str:
    """``func (file:line)``: the innermost function, at the innermost frame of the job's own
    code (the innermost frame itself when every frame is library code)."""
    if not frames:
        return "no Python frame"
    own = next((f for f in frames if not _LIBRARY.search(str(f.get("file", "")))), frames[0])
    return f"{frames[0].get('name', '?')} ({os.path.basename(str(own.get('file', '?')))}:{own.get('line', '?')})"


def group(ranks: Mapping[int, Mapping[str, Any]]) -> list[Group]:
    """The groups, smallest first (see ``_order`` for ties)."""
    by_key: dict[Any, Group] = {}
    for rank in sorted(ranks):
        r = ranks[rank]
        frames = _main_frames(r)
        if frames is None:
            err = str(r.get("error") or "no main thread found")
            # one group per kind of error: "no Python stack: pid 12 runs sleep" differs per pid
            key: Any = ("error", re.sub(r"\bpid \d+", "pid N", err))
            # an exiting rank's last traceback, when its stderr had one
            tb = list(r.get("traceback") or ())
            g = by_key.setdefault(key, Group([], err, main=tb, error=err))
        else:
            key = tuple((f.get("name"), f.get("file"), f.get("line")) for f in frames)
            g = by_key.setdefault(key, Group([], where(frames), main=frames))
        g.ranks.append(rank)
    for g in by_key.values():
        pcts = [ranks[r].get("spinning") for r in g.ranks]
        if not g.error and all(isinstance(p, int) for p in pcts):
            g.spinning = min(p for p in pcts if isinstance(p, int))
    return sorted(by_key.values(), key=_order)


def _order(g: Group) -> tuple[int, bool, int]:
    """Smallest first; of equal size, a group in the job's own code before one waiting inside a
    library (a collective, a queue): the one that does not wait is the likelier culprit."""
    waits = bool(g.main) and bool(_LIBRARY.search(str(g.main[0].get("file", ""))))
    return (len(g.ranks), waits, g.ranks[0])


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 3`` / ``ranks 0,2,3`` / ``ranks 0-62``: runs of three or more as ranges."""
    rs = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{rs[i]}-{rs[j]}")
        else:
            parts.extend(str(x) for x in rs[i : j + 1])
        i = j + 1
    return f"{'rank' if len(rs) == 1 else 'ranks'} {','.join(parts)}"


def _said(ranks: list[int], error: str, more: str = "") -> str:
    """``rank 0: py-spy failed …``, but ``rank 0 is stopped …`` / ``ranks 0,1 are stopped …``
    (``more`` goes after the ranks)."""
    if error.startswith("is "):
        return f"{rank_list(ranks)}{more} {'is' if len(ranks) == 1 else 'are'} {error[3:]}"
    return f"{rank_list(ranks)}{more}: {error}"


def headline(groups: list[Group]) -> str:
    """One line: ``rank 1 in stuck_here (hang.py:14); ranks 0,2,3 in all_reduce (hang.py:26)``."""
    return "; ".join(_said(g.ranks, g.error) if g.error else _in(g) for g in groups)


def _in(g: Group) -> str:
    """``rank 0 in f (x.py:3)``, or ``rank 0 waits in f (x.py:3) at 100 % CPU (spinning)``."""
    if g.spinning < 0:
        return f"{rank_list(g.ranks)} in {g.where}"
    verb = "waits" if len(g.ranks) == 1 else "wait"
    return f"{rank_list(g.ranks)} {verb} in {g.where} at {g.spinning} % CPU (spinning)"


def _frame_line(f: Mapping[str, Any]) -> str:
    return f"    {f.get('name', '?')} ({f.get('file', '?')}:{f.get('line', '?')})"


def format_groups(ranks: Mapping[int, Mapping[str, Any]], groups: list[Group] | None = None) -> str:
    """The full text: per group its ranks, where they are and the main thread's stack (innermost
    first), then every other thread, identical ones across the group's ranks once."""
    groups = group(ranks) if groups is None else groups
    total = len(ranks)
    lines: list[str] = []
    for g in groups:
        hosts = sorted({str(ranks[r].get("host", "")) for r in g.ranks} - {""})
        on = f" on {', '.join(hosts)}" if hosts else ""
        if g.error:
            lines.append(_said(g.ranks, g.error, f" ({len(g.ranks)}/{total}){on}"))
            if g.main:
                lines.append("  Its last traceback (stderr), innermost first:")
                lines.extend(_frame_line(f) for f in g.main)
            continue
        spin = f", spinning at {g.spinning} % CPU" if g.spinning >= 0 else ""
        lines.append(f"{rank_list(g.ranks)} ({len(g.ranks)}/{total}){on}: {g.where}{spin}")
        lines.append("  Thread MainThread:")
        lines.extend(_frame_line(f) for f in g.main)
        others: dict[Any, tuple[str, list[dict[str, Any]], list[int]]] = {}
        for rank in g.ranks:
            for t in ranks[rank].get("threads") or ():
                if t.get("main"):
                    continue
                frames = list(t.get("frames") or ())
                key = (
                    t.get("name"),
                    tuple((f.get("name"), f.get("file"), f.get("line")) for f in frames),
                )
                others.setdefault(key, (str(t.get("name")), frames, []))[2].append(rank)
        for name, frames, rs in others.values():
            whose = "" if len(rs) == len(g.ranks) else f" ({rank_list(rs)})"
            lines.append(f"  Thread {name}{whose}:")
            lines.extend(_frame_line(f) for f in frames)
    return "\n".join(lines)
