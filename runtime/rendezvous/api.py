"""The rendezvous' public types: its errors, what a handler is created from, what a round gives,
the events it reports while the workers run, and ``RendezvousHandler``, the interface every
backend implements (``handler.StoreRendezvousHandler``, ``etcd.EtcdRendezvousHandler``)."""

from __future__ import annotations

import enum
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from xrun.record import Value

from .endpoint import default_local_addr

if TYPE_CHECKING:
    from .conf import RdzvConfig
    from .endpoint import Endpoint
    from .kv import KeyValue
    from .verdict import Verdict

__all__ = [
    "RendezvousClosedError",
    "RendezvousError",
    "RendezvousEvent",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParams",
    "RendezvousTimeoutError",
]


class JobLedger(Protocol):
    """The job-wide restart budget (and, on c10d, the quarantine) as the agent's ``Restarts``
    uses it: ``budget.Ledger`` (an xrun store), ``etcd_budget.EtcdLedger`` (etcd)."""

    def used(self) -> int: ...

    def peer_at_risk(self) -> bool: ...

    def failed(self, reason: str, max_restarts: int, restart: Callable[[], None]) -> Verdict: ...


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

    backend: str
    endpoint: Endpoint  # parsed where it entered (Endpoint.parse), never re-read from text
    run_id: str
    min_nodes: int
    max_nodes: int
    local_world_size: int
    conf: Mapping[str, str]
    node_rank: int = -1
    local_addr: str | None = None
    private_store: bool = False
    node_id: str = ""  # set: the job-wide restart budget and the quarantine (budget.py)
    spares: int = 0  # --spares: park when the world is full, keep slots (spares.py)


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


class RendezvousInfo(Value):
    """What a formed round gives one node. The whole member list (``local_world_sizes``,
    ``addrs``) is read from the store only when asked for: a node needs its own place (its
    group rank, the global rank of its first worker, the sizes), and at 16,384 nodes a copy of
    the whole list per node would make the rendezvous quadratic. ``members`` is neither
    compared nor printed."""

    round: int
    group_rank: int
    group_world_size: int
    rank_offset: int  # global rank of this node's local rank 0
    world_size: int  # workers in the world
    members: Members
    __slots__ = ("members",)  # a slot, not a field

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


_handler_seq = 0
_handler_seq_lock = threading.Lock()


class RendezvousHandler(ABC):
    """One agent's membership in one job's rendezvous, round after round: all the agent knows of
    a backend (``backends.create_handler`` picks the backend's class).

    The agent calls ``next_rendezvous()`` to join a round, ``select()``s on ``fileno()`` while
    its workers run, asks ``poll_event()`` what happened when that fd becomes readable, and
    leaves with ``finish()`` (its workers succeeded), ``close()`` (it gives up) or ``shutdown()``
    (always, last). Errors are ``RendezvousError``s: ``RendezvousClosedError`` when the job was
    closed (``failed`` says whether it failed), ``RendezvousTimeoutError`` when a round did not
    form in time."""

    params: RendezvousParams
    cfg: RdzvConfig  # --rdzv-conf, parsed: its timeouts mean the same for every backend
    addr: str  # the address this node advertises to its peers
    sortkey: str  # this node's place among members of the same address (the rank rule)

    def __init__(self, params: RendezvousParams, cfg: RdzvConfig) -> None:
        """What every backend's handler holds. The rank rule is the same for all: members
        sorted by (advertised address, ``sortkey``), where ``sortkey`` is the node rank for
        ``static`` and (process id, creation order of the handler in that process) otherwise,
        so the same hosts get the same ranks in every round they are all part of."""
        global _handler_seq
        self.params = params
        self.cfg = cfg
        self.addr = params.local_addr or default_local_addr()
        with _handler_seq_lock:
            _handler_seq += 1
            seq = _handler_seq
        if params.backend == "static":
            self.sortkey = f"{params.node_rank:08d}"
        else:
            self.sortkey = f"{os.getpid():08d}.{seq:08d}"

    # -- where the job is ----------------------------------------------------------------------

    @property
    @abstractmethod
    def endpoint(self) -> Endpoint:
        """The rendezvous' endpoint (port 0 resolved): what errors name."""

    @property
    @abstractmethod
    def is_host(self) -> bool:
        """Whether this node serves the workers' store (and so holds the exit barrier)."""

    @property
    @abstractmethod
    def workers_address(self) -> tuple[str, int]:
        """(MASTER_ADDR, MASTER_PORT): the workers' store of the current round."""

    # -- joining and watching ------------------------------------------------------------------

    @abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it forms."""

    @abstractmethod
    def fileno(self) -> int:
        """A descriptor that turns readable when ``poll_event`` has news."""

    @abstractmethod
    def poll_event(self) -> tuple[RendezvousEvent, str] | None:
        """Non-blocking: (CLOSED, reason) / (RESTART, reason) / None."""

    @property
    @abstractmethod
    def closed_failed(self) -> bool:
        """After ``poll_event`` returned CLOSED: did the job fail (a peer gave up, the
        rendezvous was lost) rather than finish? The agent exits 1 for the first, 0 for the
        second."""

    @property
    def lost(self) -> bool:
        """After ``poll_event`` returned CLOSED: whether the end is this node's own loss of
        the rendezvous service rather than a peer's verdict (the agent then says so instead of
        "closed by a peer"). A backend whose handler only learns of the end from its peers
        keeps this False."""
        return False

    @abstractmethod
    def kv(self) -> KeyValue:
        """The agent's own keys in the job's store (the stall watchdog's exchange);
        on etcd, group rank 0's store (etcd_agent_kv.py); ``RendezvousError`` when unreachable."""

    def warm_spares(self, pool: Any) -> None:  # noqa: B027 - a no-op unless overridden
        """``--spares --recover warm``: share the modules ``pool``'s workers import with the
        job's spares, and take theirs when parked as one; a no-op where spares cannot run."""

    def ledger(self) -> JobLedger | None:
        """The job-wide restart budget and quarantine (``budget.py``), when the job has more
        than one node and the backend keeps it (``params.node_id`` set); else None: the agent
        counts its own restarts."""
        return None

    # -- leaving -------------------------------------------------------------------------------

    @abstractmethod
    def request_restart(self, reason: str) -> None:
        """A local worker failed; every node of the round (this one too) sees RESTART."""

    @abstractmethod
    def close(self, failed: bool, reason: str) -> None:
        """This node gives up: every peer sees CLOSED (and next_rendezvous raises it)."""

    @abstractmethod
    def finish(self, timeout: float | None = None) -> list[str]:
        """Our workers all succeeded. The host waits (<= ``timeout``, default conf
        ``exit_barrier_timeout``) for the round's other nodes to finish or leave, then closes
        the job (failed, naming them, if some did not finish). Returns the addresses of the
        nodes that did not finish (host only)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Let go of everything this handler holds (threads, sockets, a store it serves);
        idempotent."""

    def __enter__(self) -> RendezvousHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
