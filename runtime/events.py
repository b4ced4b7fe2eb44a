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


@dataclass(frozen=True)
class Stalled:
    """No worker made progress for ``--stall-timeout`` seconds (``diagnose.watch``): ``reason``
    is the root cause line, ``report`` the local ranks' grouped stacks."""

    reason: str
    report: str


AgentEvent = WorkersDone | Signalled | RendezvousChanged | JobClosed | Stalled
