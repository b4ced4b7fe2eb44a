"""What ends the agent's wait on a running worker group (``Agent._watch``): small typed values
that the agent ``match``es on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .workers.api import RunProcsResult

__all__ = ["AgentEvent", "JobClosed", "RendezvousChanged", "Signalled", "Stalled", "WorkersDone"]


@dataclass(frozen=True)
class WorkersDone:
    """Every worker exited 0, or one failed (the others may still run)."""

    result: RunProcsResult


@dataclass(frozen=True)
class Signalled:
    """The agent got one of the signals it handles."""

    signum: int


@dataclass(frozen=True)
class RendezvousChanged:
    """The round is stale: a peer's worker failed, or a node joined or left."""

    reason: str


@dataclass(frozen=True)
class JobClosed:
    """The job was closed: it ``failed`` (a peer gave up, the store was lost) or it finished
    without this node."""

    reason: str
    failed: bool


class Stalled:
    """No worker made progress for ``--stall-timeout`` seconds (``diagnose.watch``): ``reason``
    is the root cause line, ``report`` the local ranks' grouped stacks. A plain class (a
    dataclass costs every agent's start-up, benchmark 1, a few hundred microseconds to make;
    this event is rare)."""

    __slots__ = ("reason", "report")
    __match_args__ = ("reason", "report")

    def __init__(self, reason: str, report: str) -> None:
        self.reason, self.report = reason, report

    def __repr__(self) -> str:
        return f"Stalled(reason={self.reason!r}, report={self.report!r})"


AgentEvent = WorkersDone | Signalled | RendezvousChanged | JobClosed | Stalled
