"""The rendezvous' public types: its errors, what a handler is created from, what a round gives
and the events it reports while the workers run."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from xrun.record import Value

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


class RendezvousParams(Value):
    """What the agent hands its rendezvous backend. ``private_store``: True when this handler
    is its store's only user (a standalone agent: port 0, a port nobody else learns): with no
    secret configured, make up a random one, so that the store is never open to other users of
    the host. A plain value class, as are the others here: a dataclass costs every agent's
    start-up (benchmark 1) ~1.6 ms to make."""

    __slots__ = _fields = (
        "backend",
        "endpoint",
        "run_id",
        "min_nodes",
        "max_nodes",
        "local_world_size",
        "conf",
        "node_rank",
        "local_addr",
        "private_store",
    )
    backend: str
    endpoint: Endpoint  # parsed where it entered (Endpoint.parse), never re-read from text
    run_id: str
    min_nodes: int
    max_nodes: int
    local_world_size: int
    conf: Mapping[str, str]
    node_rank: int
    local_addr: str | None
    private_store: bool

    def __init__(  # noqa: PLR0913 (one argument per field, as a dataclass's)
        self,
        backend: str,
        endpoint: Endpoint,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_world_size: int,
        conf: Mapping[str, str],
        node_rank: int = -1,
        local_addr: str | None = None,
        private_store: bool = False,
    ) -> None:
        Value.__init__(
            self,
            backend,
            endpoint,
            run_id,
            min_nodes,
            max_nodes,
            local_world_size,
            conf,
            node_rank,
            local_addr,
            private_store,
        )


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


_INFO_FIELDS = ("round", "group_rank", "group_world_size", "rank_offset", "world_size")


class RendezvousInfo(Value):
    """What a formed round gives one node. The whole member list (``local_world_sizes``,
    ``addrs``) is read from the store only when asked for: a node needs its own place (its
    group rank, the global rank of its first worker, the sizes), and at 16,384 nodes a copy of
    the whole list per node would make the rendezvous quadratic. ``members`` is neither
    compared nor printed."""

    __slots__ = (*_INFO_FIELDS, "members")
    _fields = _INFO_FIELDS
    round: int
    group_rank: int
    group_world_size: int
    rank_offset: int  # global rank of this node's local rank 0
    world_size: int  # workers in the world
    members: Members

    def __init__(
        self,
        round: int,
        group_rank: int,
        group_world_size: int,
        rank_offset: int,
        world_size: int,
        members: Members,
    ) -> None:
        Value.__init__(self, round, group_rank, group_world_size, rank_offset, world_size)
        object.__setattr__(self, "members", members)

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
