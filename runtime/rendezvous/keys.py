"""What the rendezvous keeps in the store: the key names of a job's rounds, the formed world and
the closed verdict (see the protocol in the package docstring).

Keys live under ``<run_id>/rdzv/``; round ``r`` counts up from 0.
"""

from __future__ import annotations

import json

from xrun.record import Value

from .api import RendezvousClosedError

__all__ = ["FINISHED", "HOST_KEY", "SEAL", "Keys", "Seat", "World", "closed_error", "verdict"]

# Set by the store's host when it starts serving: the run id of the job it belongs to.
HOST_KEY = "xrun/host_run_id"
# Added to a round's join counter to seal it: a later arrival reads a count >= SEAL.
SEAL = 1 << 40
# Added to a formed round's ``fate`` counter by each node that finishes it; a newcomer adds 1
# before it asks the round to re-form, and does not once the count is >= FINISHED.
FINISHED = 1 << 40


class Keys:
    """The key names of one job's rendezvous."""

    __slots__ = ("closed", "cur", "prefix", "workers")

    def __init__(self, run_id: str) -> None:
        self.prefix = f"{run_id}/rdzv/"
        self.closed = self.prefix + "closed"  # the verdict: set once the job is over
        self.cur = self.prefix + "cur"  # the round to join next (a hint: formed rounds + 1)
        # The workers' generation: the round whose workers the store's torch clients belong to.
        # Written by the sealer before the world, so before any worker of the round starts;
        # the store gives every later torch connection a fresh key space (store/server.py).
        self.workers = self.prefix + "workers"

    def of(self, rnd: int, name: str) -> str:
        """Round ``rnd``'s key ``name`` (``join``, ``node/3``, ``world``, ``stale`` ...)."""
        return f"{self.prefix}{rnd}/{name}"


def verdict(failed: bool, reason: str) -> bytes:
    """What ``closed`` holds: did the job fail (a peer gave up) or finish, and why."""
    return json.dumps({"failed": failed, "reason": reason}).encode()


def closed_error(raw: bytes) -> RendezvousClosedError:
    """The error a node raises (or reports) for the verdict ``raw``."""
    try:
        d = json.loads(raw)
        return RendezvousClosedError(str(d["reason"]), bool(d["failed"]))
    except (ValueError, KeyError, TypeError):
        return RendezvousClosedError(raw.decode(errors="replace"), True)


class Seat(Value):
    """What one arrival of a formed round reads in ``<r>/seat/<i>`` (and ``<r>/world`` holds
    the same minus the rank): its group rank (-1: the round formed without it), the global
    rank of its local rank 0, the number of nodes and of workers. A few bytes, whatever the
    size of the world: N nodes read N seats, not N copies of an N-node list. Seat and World
    are plain value classes: a dataclass costs every agent's start-up (benchmark 1) ~0.8 ms
    to make."""

    rank: int
    rank_offset: int
    nodes: int
    world_size: int

    def encode(self) -> bytes:
        return f"{self.rank}\t{self.rank_offset}\t{self.nodes}\t{self.world_size}".encode()

    @classmethod
    def parse(cls, raw: bytes) -> Seat:
        rank, offset, nodes, world_size = raw.split(b"\t")
        return cls(int(rank), int(offset), int(nodes), int(world_size))


class World(Value):
    """A formed round's members as stored in ``<r>/members``: three sections separated by
    newlines:
    arrival indices in rank order ("3,1,2"), nprocs run-length encoded ("8*1024" or "8*2,4*1"),
    then one advertised address per line."""

    round: int
    indices: tuple[str, ...]  # arrival index (decimal) of each group rank
    local_world_sizes: tuple[int, ...]
    addrs: tuple[str, ...]

    @classmethod
    def parse(cls, rnd: int, blob: bytes) -> World:
        # Read only by whoever asks for the addresses (RendezvousInfo.addrs): the agent does not.
        idx, lws_s, addrs = blob.decode().split("\n", 2)
        lws: list[int] = []
        for run in lws_s.split(","):
            n, _, count = run.partition("*")
            lws.extend([int(n)] * int(count))
        return cls(rnd, tuple(idx.split(",")), tuple(lws), tuple(addrs.split("\n")))

    @staticmethod
    def encode(members: list[tuple[str, str, int, int]]) -> bytes:
        """``(addr, sortkey, index, nproc)`` in rank order -> the stored form."""
        runs: list[list[int]] = []
        for m in members:
            if runs and runs[-1][0] == m[3]:
                runs[-1][1] += 1
            else:
                runs.append([m[3], 1])
        return "\n".join(
            [
                ",".join(str(m[2]) for m in members),
                ",".join(f"{n}*{k}" for n, k in runs),
                *(m[0] for m in members),
            ]
        ).encode()

    def rank_of(self, index: int) -> int:
        """Group rank of the node that arrived as ``index``, or -1 if it is not a member."""
        try:
            return self.indices.index(str(index))
        except ValueError:
            return -1
