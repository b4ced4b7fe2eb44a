"""The rendezvous' public types: its errors, what a handler is created from, what a round gives
and the events it reports while the workers run."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .endpoint import Endpoint

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
    endpoint: Endpoint  # parsed where it entered (Endpoint.parse), never re-read from text
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


class Members:
    """A formed round's member list, read from the store on first use and kept."""

    __slots__ = ("_load", "_value")

    def __init__(self, load: Callable[[], tuple[tuple[int, ...], tuple[str, ...]]]) -> None:
        self._load = load
        self._value: tuple[tuple[int, ...], tuple[str, ...]] | None = None

    def get(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        if self._value is None:
            self._value = self._load()
        return self._value


@dataclass(frozen=True)
class RendezvousInfo:
    """What a formed round gives one node. The whole member list (``local_world_sizes``,
    ``addrs``) is read from the store only when asked for: a node needs its own place (its
    group rank, the global rank of its first worker, the sizes), and at 16,384 nodes a copy of
    the whole list per node would make the rendezvous quadratic."""

    round: int
    group_rank: int
    group_world_size: int
    rank_offset: int  # global rank of this node's local rank 0
    world_size: int  # workers in the world
    members: Members = field(repr=False, compare=False)

    @property
    def local_world_sizes(self) -> tuple[int, ...]:
        """Each node's number of workers, in group-rank order (read from the store)."""
        return self.members.get()[0]

    @property
    def addrs(self) -> tuple[str, ...]:
        """Each node's advertised address, in group-rank order (read from the store)."""
        return self.members.get()[1]


class RendezvousEvent(enum.Enum):
    RESTART = "restart"
    CLOSED = "closed"
