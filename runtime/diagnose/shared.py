"""The nodes' shared progress (watch.py, "On several nodes"), exchanged off the agent's watch loop.

Each agent adds its news to one counter in the job's store (``diagnose/progress`` under its
``kv()`` keys): 1 when its workers worked, ``SAID`` when they also showed a sign of life. The
rest of a change of the counter is the other nodes' share, which tells which of the two happened
there (a node adds at most ``SAID + 1`` at a time; a share too large to tell apart reads as a sign
of life, the safe side).

The store is served by another node's agent (or an etcd job's group rank 0's), and a paused or
busy host answers late: up to the store's read timeout (60 s). A store call on the agent's watch
loop held up everything the loop does meanwhile, seeing a worker exit or the SIGTERM of a
pre-emption among it. So the check only posts its news (``post``, never blocks) and takes what
the thread learnt since (``take``); the thread (``rendezvous/sender.py``) makes the one store
call, one at a time. ``take`` also says whether the thread's view of the other nodes is
*fresh*: an answer came to an add made within ``fresh_s`` of now. While it is not, the check
declares no stall (a store that is slow is not the workers' stall; a store that is gone ends the
rendezvous itself).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..rendezvous import RendezvousError
from ..rendezvous.sender import Sender

if TYPE_CHECKING:
    from ..rendezvous.kv import KeyValue

__all__ = ["KEY", "SAID", "SharedProgress"]

KEY = "diagnose/progress"
SAID = 1 << 20


class SharedProgress(Sender[int, int]):
    """One worker group's exchange (one per ``attach``): ``kv`` opens the store's keys (called
    in the thread: connecting to a hung store blocks too); ``fresh_s``: how old the last answer
    may be before the view is stale (and it is, until the first answer)."""

    ERRORS = (RendezvousError,)
    THREAD = "xrun-stall-progress"

    def __init__(self, kv: Callable[[], KeyValue], fresh_s: float) -> None:
        super().__init__()
        self._kv, self._fresh_s = kv, fresh_s
        self._pending: int | None = None  # news not sent yet (None: no check since the last)
        self._sent_at = 0.0  # when the add in flight was taken
        self._shared = -1  # the counter as last read (-1: never; the first read has no share)
        self._theirs = 0  # the others' share learnt since the last ``take``
        self._answered = -math.inf  # when the last answered add was taken: the view's age

    def post(self, said: bool, worked: bool) -> None:
        """A check's news (never blocks: the thread sends it, merged with any not sent yet)."""
        self((SAID if said else 0) | (1 if worked else 0))

    def take(self, now: float) -> tuple[bool, bool, bool]:
        """(another node showed a sign of life, another node worked, the view is fresh), the
        first two since the last ``take``."""
        with self._cond:
            theirs, self._theirs = self._theirs, 0
            fresh = now - self._answered <= self._fresh_s
        return theirs >= SAID, theirs > 0, fresh

    def _add(self, news: int) -> None:
        self._pending = (self._pending or 0) | news

    def _take(self) -> int | None:
        mine, self._pending = self._pending, None
        if mine is not None:
            self._sent_at = time.monotonic()
        return mine

    def _keep(self, item: int) -> None:
        self._add(item)  # a failed add counted nothing: it goes again with the newer news

    def _send(self, item: int) -> None:
        value = self._kv().add(KEY, item)  # an add of 0 reads the counter
        with self._cond:
            if self._shared >= 0:
                self._theirs += max(0, value - self._shared - item)
            self._shared = value
            self._answered = self._sent_at
