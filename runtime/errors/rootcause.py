"""The root cause of a worker's failure when the worker wrote no error file (no ``@record``).

torch's agent then reports only "To enable traceback see: …", although the traceback sits in the
worker's stderr. When that stderr goes to a file (``--tee``/``--redirects``, which every xrun
scheduler's ``dist.ddp`` sets) the agent reads the file's tail and takes the last Python
traceback in it; a death by signal is explained by ``deaths.py``. The result is written into
the failure the way ``@record`` would have written it, so the summary, the agent's error file
and ``xrun status`` all show it with no code of their own::

    ValueError: bad shape in batch 7 (rank 1, boom.py:5)

A failure with an error file keeps it: what the worker recorded is the better account.
Standard library only, on the failure path alone.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from .deaths import OomRise, OomWatch, signal_cause
from .failure import NO_ERROR_FILE_MESSAGE, ProcessFailure
from .report import root_cause


class _Expired(Protocol):
    @property
    def signum(self) -> int: ...

    def text(self) -> str: ...


class TimerKills(Protocol):
    """What the file timer (``runtime/timer``) killed: read here, owned there."""

    def expired(self, pid: int) -> _Expired | None: ...


__all__ = [
    "Cause",
    "Traceback",
    "describe",
    "explain_attempt",
    "explain_failures",
    "last_traceback",
    "parse_traceback",
]

# A traceback longer than this is cut from its top: the end holds the exception and the frame
# that raised it. 64 KiB holds a few hundred frames.
TAIL_BYTES = 64 * 1024
_HEADER = "Traceback (most recent call last):"
# torch's excepthook after init_process_group: "[rank3]: " before every line of a traceback
_RANK = re.compile(r"\[rank\d+\]: ")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+)')
# faulthandler's dump after a fatal signal: "Fatal Python error: Segmentation fault" and then
# frames as '  File "x.py", line 4 in f', innermost first.
_FATAL = "Fatal Python error:"


@dataclass(frozen=True)
class Traceback:
    """A Python traceback read from a stream: its ``text``, the ``exception`` line
    (``"ValueError: bad shape"``) and ``where`` it was raised (``"boom.py:5"``, "" unknown)."""

    text: str
    exception: str
    where: str


def _tail(path: str, size: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read(size)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _where(frame_line: str) -> str:
    m = _FRAME.match(frame_line)
    return f"{os.path.basename(m['file'])}:{m['line']}" if m else ""


def _unprefixed(text: str) -> list[str]:
    """The lines of the stream that the last traceback in it belongs to, without torch's rank
    prefix.

    A worker that called ``init_process_group`` prints an uncaught exception with every line
    prefixed ``[rankN]: `` (torch's excepthook; blank lines stay bare). A stream may also carry
    lines of other processes in between (a rank's own children, a native library's log), so the
    traceback is read from the lines with the prefix its last header has, plus blank lines."""
    lines = text.splitlines()
    split = [(m[0], line[m.end() :]) if (m := _RANK.match(line)) else ("", line) for line in lines]
    last = max((i for i, (_, body) in enumerate(split) if body.startswith(_HEADER)), default=-1)
    if last < 0:
        return []
    own = split[last][0]
    return [body for prefix, body in split if prefix == own or not body]


def parse_traceback(text: str) -> Traceback | None:
    """The last complete traceback in ``text``; None when there is none.

    A chained exception prints the cause's traceback first and the final one last, so the last
    header starts the one that ended the process. Its exception line is the first line after
    the header that is not indented (frames, source lines and SyntaxError's carets are)."""
    lines = _unprefixed(text)
    start = max((i for i, line in enumerate(lines) if line.startswith(_HEADER)), default=-1)
    if start < 0:
        return None
    frames: list[str] = []
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line[:1] in (" ", "\t") or not line:
            if _FRAME.match(line):
                frames.append(line)
            continue
        exc = line.strip()
        # a multi-line message (a KeyError of a dict, a long assert) goes on unindented: keep
        # its first line for the headline, all of it in the text
        end = i + 1
        while end < len(lines) and lines[end] and not lines[end].startswith(("[", _HEADER)):
            end += 1
            if end - i > 20:
                break
        body = "\n".join(lines[_chain_start(lines, start) : end])
        return Traceback(body, exc, _where(frames[-1]) if frames else "")
    return None


_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def _chain_start(lines: list[str], start: int) -> int:
    """Where the chain that ends in the traceback at ``start`` begins: its causes and the
    exceptions it was raised while handling are printed before it, and belong to the story."""
    while start >= 2 and lines[start - 2].strip() in _CHAINED:
        earlier = [i for i in range(start - 2) if lines[i].startswith(_HEADER)]
        if not earlier:
            break
        start = earlier[-1]
    return start


def last_traceback(path: str) -> Traceback | None:
    """The last traceback in the tail of the file at ``path`` (a worker's stderr log)."""
    return parse_traceback(_tail(path)) if path else None


def _fatal_error(text: str) -> tuple[str, str]:
    """faulthandler's block after a fatal signal: ``(block, where)``, or ``("", "")``."""
    lines = text.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith(_FATAL)), default=-1)
    if start < 0:
        return "", ""
    block = lines[start : start + 40]
    where = next((_where(x) for x in block if _FRAME.match(x)), "")
    return "\n".join(block), where


def _last_line(text: str) -> str:
    return next((x.strip() for x in reversed(text.splitlines()) if x.strip()), "")


@dataclass(frozen=True)
class Cause:
    """A failure's headline (one line) and its longer account (the traceback, or details)."""

    headline: str
    detail: str


def describe(
    f: ProcessFailure,
    rank: int,
    stderr: str,
    sent_by_agent: tuple[int, ...] = (),
    oom: OomRise | None = None,
    cgroup_read: bool = False,
    after: int | None = None,
    timer: str = "",
) -> Cause:
    """The cause of ``f`` (global ``rank``), read from its ``stderr`` log file ("" none);
    ``after``: the rank whose failure made the agent stop this one; ``timer``: why the file
    timer killed it ("" it did not)."""
    tail = _tail(stderr) if stderr else ""
    interrupt = _keyboard_interrupt(f, tail, sent_by_agent) if not timer else None
    if interrupt is not None:
        return interrupt.cause(rank, f.pid)
    if f.exitcode < 0:
        why = timer or signal_cause(-f.exitcode, sent_by_agent, oom, cgroup_read, f.pid)
        if after is not None and -f.exitcode in sent_by_agent:
            why += f"; rank {after} failed first"
        block, where = _fatal_error(tail)
        at = f", {where}" if where else ""
        detail = f"{why} (pid {f.pid})"
        if block:
            detail += f"\n{block}"
        return Cause(f"{why} (rank {rank}{at})", detail)
    # An uncaught exception exits 1; with any other code a traceback in stderr was one the
    # program caught and printed, not what ended it.
    tb = parse_traceback(tail) if f.exitcode == 1 else None
    if tb is not None:
        at = f", {tb.where}" if tb.where else ""
        return Cause(f"{tb.exception} (rank {rank}{at})", tb.text)
    why = f"exited with code {f.exitcode}"
    if not stderr:  # its stderr went to the console: nothing to read back
        hint = "its stderr is in no file (-r/-t 2 keep one) and it wrote no error file"
        return Cause(
            f"{why} (rank {rank})", f"{why} (pid {f.pid}); {hint}: {NO_ERROR_FILE_MESSAGE}"
        )
    last = _last_line(tail)
    said = f"; its last stderr line: {last[:200]}" if last else ""
    return Cause(f"{why} (rank {rank}){said}", f"{why} (pid {f.pid}){said}")


class _Interrupt:
    """An uncaught ``KeyboardInterrupt``: Python ends such a process by raising SIGINT on itself,
    so its exit status reads "killed by SIGINT" whether a signal came or the code raised it."""

    __slots__ = ("raised", "tb")

    def __init__(self, tb: Traceback, raised: bool | None) -> None:
        self.tb = tb
        self.raised = raised  # None: the source line is not shown, so it cannot be told

    def cause(self, rank: int, pid: int) -> Cause:
        if self.raised:
            why = "KeyboardInterrupt raised in the worker"
        elif self.raised is None:
            why = "KeyboardInterrupt in the worker (SIGINT from outside the agent, or raised by it)"
        else:  # the interrupt hit a line that does not raise it: a SIGINT arrived
            why = "killed by SIGINT from outside the agent (KeyboardInterrupt)"
        at = f", {self.tb.where}" if self.tb.where else ""
        return Cause(f"{why} (rank {rank}{at})", f"{why} (pid {pid})\n{self.tb.text}")


def _keyboard_interrupt(f: ProcessFailure, tail: str, sent: tuple[int, ...]) -> _Interrupt | None:
    """The worker's uncaught ``KeyboardInterrupt``, when it died of a SIGINT the agent did not
    send and its stderr ends in that traceback; None otherwise."""
    if f.exitcode != -signal.SIGINT or signal.SIGINT in sent:
        return None
    tb = parse_traceback(tail)
    if tb is None or tb.exception.split(":")[0] != "KeyboardInterrupt":
        return None
    # the source line under the innermost frame: "raise KeyboardInterrupt…" is the code's own
    lines = tb.text.splitlines()
    last = max((i for i, x in enumerate(lines) if _FRAME.match(x)), default=-1)
    source = lines[last + 1].strip() if 0 <= last < len(lines) - 1 else ""
    if last < 0 or not source or not lines[last + 1][:1].isspace():
        return _Interrupt(tb, None)
    return _Interrupt(tb, source.startswith("raise") and "KeyboardInterrupt" in source)


def explain_failures(
    failures: Mapping[int, ProcessFailure],
    stderrs: Mapping[int, str],
    sent: Mapping[int, tuple[int, ...]],
    oom: OomRise | None,
    cgroup_read: bool,
    timer: Mapping[int, str] | None = None,
) -> None:
    """Give every failure without an error file its cause, in place (all by global rank).

    The cause goes where ``@record`` puts a traceback (``error_file_data``, torchelastic's
    schema; ``message`` the headline), so every reader of failures shows it; ``error_file``
    stays ``"<N/A>"``: no such file exists."""
    root = root_cause(failures) if failures else None
    for rank, f in failures.items():
        if f.has_error_file():
            continue
        # a rank the agent stopped is a casualty of the root cause, not a cause of its own
        after = root if rank != root and sent.get(rank) else None
        why = (timer or {}).get(rank, "")
        cause = describe(
            f, rank, stderrs.get(rank, ""), sent.get(rank, ()), oom, cgroup_read, after, why
        )
        traits = f.error_file_data.get("errorTraits")
        f.message = cause.headline
        f.error_file_data = {
            "message": {
                "message": cause.headline,
                "extraInfo": {"py_callstack": cause.detail, "timestamp": str(f.timestamp)},
            }
        }
        if traits is not None:
            f.error_file_data["errorTraits"] = traits


def explain_attempt(
    failures: Mapping[int, ProcessFailure],
    offset: int,
    stderrs: Mapping[int, str],
    sent: Mapping[int, tuple[int, ...]],
    oom: OomWatch | None,
    timer: TimerKills | None = None,
) -> None:
    """``explain_failures`` for one attempt of the agent: ``stderrs`` and ``sent`` by local
    rank (``offset`` makes them global), ``oom`` the counters read at the attempt's start,
    ``timer`` the file timer that may have killed some."""
    killed = {}
    for rank, f in failures.items():
        why = timer.expired(f.pid) if timer is not None else None
        if why is not None and f.exitcode == -why.signum:
            killed[rank] = why.text()  # the file timer's kill, not one from outside
    explain_failures(
        failures,
        {offset + r: p for r, p in stderrs.items()},
        {offset + r: s for r, s in sent.items()},
        oom.rise() if oom is not None else None,
        oom is not None and oom.counter.covered(),
        killed,
    )
