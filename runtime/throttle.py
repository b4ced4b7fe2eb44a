"""A log line that anyone can trigger, rate-limited: the first few are written, then a count.

Some of the agent's log lines are caused by others: a connection the store guard refuses
(any local user can open thousands a second, issue #31 P7), a malformed request on the file
timer's FIFO (a buggy worker, M6). One line each would let them grow the job's log without
bound. A :class:`Throttle` lets the first ``first`` lines through as they are, then holds the
rest back and says how many in one line at most every ``period`` seconds (and at
:meth:`Throttle.flush`, when the caller ends).

Standard library only, no lock: each throttle is used by one thread (the store's event loop,
the timer's thread); a lost count in a race would only make a summary one short.
"""

from __future__ import annotations

import time

__all__ = ["Throttle"]


class Throttle:
    """``line(text)`` is the line to write for one more event: ``text`` itself for the first
    ``first`` events, then None, except at most once per ``period`` seconds the summary
    ``summary.format(n=HELD, s=SECONDS)`` of the events held back since the last line."""

    def __init__(self, summary: str, first: int = 5, period: float = 60.0) -> None:
        self.summary, self.first, self.period = summary, first, period
        self._shown = 0
        self._held = 0
        self._since = 0.0  # when the held events began to count (the last line written)

    def line(self, text: str, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        if self._shown < self.first:
            self._shown += 1
            self._since = now
            if self._shown == self.first:
                return f"{text} (any more are counted, in one line per {self.period:g} s)"
            return text
        self._held += 1
        if now - self._since >= self.period:
            return self.flush(now)
        return None

    def flush(self, now: float | None = None) -> str | None:
        """The summary of the events held back so far (None when there are none), now: for
        the end of the thing being watched, so the last count is not lost."""
        if not self._held:
            return None
        now = time.monotonic() if now is None else now
        text = self.summary.format(n=self._held, s=max(1, round(now - self._since)))
        self._held, self._since = 0, now
        return text
