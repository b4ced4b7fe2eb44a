"""What ends the agent's wait on a running worker group (``Agent._watch``): small typed values
that the agent ``match``es on.

Plain value classes (:class:`xrun.record.Value`), not dataclasses: making a dataclass class
costs 0.4-0.9 ms on every agent's start-up (benchmark 1); these five cost ~0.1 ms together."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xrun.record import Value

if TYPE_CHECKING:
    from .workers.api import RunProcsResult

__all__ = ["AgentEvent", "JobClosed", "RendezvousChanged", "Signalled", "Stalled", "WorkersDone"]


class WorkersDone(Value):
    """Every worker exited 0, or one failed (the others may still run)."""

    result: RunProcsResult


class Signalled(Value):
    """The agent got one of the signals it handles."""

    signum: int


class RendezvousChanged(Value):
    """The round is stale: a peer's worker failed, or a node joined or left."""

    reason: str


class JobClosed(Value):
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
