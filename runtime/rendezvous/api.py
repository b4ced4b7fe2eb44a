"""The rendezvous' public types: its errors, what a handler is created from, what a round gives
and the events it reports while the workers run."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "RendezvousClosedError",
    "RendezvousError",
    "RendezvousEvent",
    "RendezvousInfo",
    "RendezvousParams",
    "RendezvousTimeoutError",
]


class RendezvousError(Exception):
    """Base class of every rendezvous failure."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """join_timeout expired before ``min_nodes`` nodes joined (or a kv get ran out of time)."""


class RendezvousClosedError(RendezvousError):
    """The job was closed: a peer gave up (``failed``), the job finished, or the store is gone."""

    def __init__(self, reason: str, failed: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.failed = failed


@dataclass(frozen=True)
class RendezvousParams:
    backend: str
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int
    local_world_size: int
    conf: Mapping[str, str]
    node_rank: int = -1
    local_addr: str | None = None
    # True when this handler is its store's only user (a standalone agent: port 0, a port
    # nobody else learns): with no secret configured, make up a random one, so that the store
    # is never open to other users of the host.
    private_store: bool = False


@dataclass(frozen=True)
class RendezvousInfo:
    round: int
    group_rank: int
    group_world_size: int
    local_world_sizes: tuple[int, ...]
    addrs: tuple[str, ...]

    @property
    def rank_offset(self) -> int:
        """Global rank of this node's local rank 0."""
        return sum(self.local_world_sizes[: self.group_rank])

    @property
    def world_size(self) -> int:
        return sum(self.local_world_sizes)


class RendezvousEvent(enum.Enum):
    RESTART = "restart"
    CLOSED = "closed"
