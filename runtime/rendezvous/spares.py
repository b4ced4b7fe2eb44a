"""Warm spares (``--spares S``, c10d): agents that stand by, parked on the store, and take a lost
node's slot - the same group rank, so the same global ``RANK`` range.

**Who is a spare.** No flag says it: a job has ``--nnodes N`` active seats and S spare agents,
and an agent is a spare when it arrives while the N seats are taken (the first N arrivals of
round 0 are active; an agent that joins later finds a full world running). Every agent of the
job gets the same ``--spares``; it only turns on the two rules below (and the spare's wait
without ``join_timeout``), it caps nothing.

**Parking.** A spare holds no arrival index in any round while it waits: it ``park``\\ s on
round ``r`` (the running one) with blocking ``WAIT``\\ s on the server - for the world to form,
for it to go stale, for every member to be out of it (``r/left/i``) - and only then takes an
arrival index in round ``r + 1``. Every member of ``r`` that re-forms is counted in ``r + 1``
before its ``left`` is set, so by then the survivors hold their indices: a spare can never
take a survivor's place and push it out to a later round. If ``r + 1`` is full of survivors
(a worker failure, not a lost node) the spare's index comes too late (``> N``) and it parks
on ``r + 1``. No heartbeat, no lease, no timer while parked: it costs the store one pending
``WAIT`` and the spare no CPU. It ends when the job closes (finished: exit 0).

**Slot inheritance.** In a job with spares each node's entry carries the group rank it held in
its previous round (its *slot*, -1 for a node new to the job). The sealer keeps every node on
its slot and gives the free slots, lowest first, to the newcomers in the rank rule's order;
if fewer nodes than slots remain (no spare left, an elastic job shrinks) the slots close up in
order. So a spare that replaces group rank 1 becomes group rank 1, and ``RANK``\\ s stay stable.
Without ``--spares`` every entry says -1 and the rank rule is the one it always was.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..store.client import StoreClient
from .keys import Keys, Seat, World, closed_error

__all__ = ["by_slot", "park", "say"]

# (addr, sortkey, arrival index, nproc, slot), as the sealer reads the node entries
Entry = tuple[str, str, int, int, int]


def park(c: StoreClient, k: Keys, rnd: int, notify: Callable[[int, int], None]) -> None:
    """Block until round ``rnd`` formed, went stale and every member of it left it: then a
    spare may take an index in round ``rnd + 1``. ``notify(rnd, nodes)`` on the formed world:
    one with room (an elastic job) re-forms to take the spare in. Raises the job's verdict
    (``RendezvousClosedError``) when it closes meanwhile."""
    world = _wait_one(c, k, k.of(rnd, "world"))
    notify(rnd, Seat.parse(world).nodes)
    say(f"standing by as a spare: the world of round {rnd} is full")
    _wait_one(c, k, k.of(rnd, "stale"))
    members = World.parse(rnd, _wait_one(c, k, k.of(rnd, "members")))
    for i in members.indices:
        if i:
            _wait_one(c, k, k.of(rnd, f"left/{i}"))
    say(f"round {rnd} went stale and its members left it: trying for a seat in round {rnd + 1}")


def _wait_one(c: StoreClient, k: Keys, key: str) -> bytes:
    vals = c.wait([key, k.closed], want_all=False, timeout=None)
    assert vals is not None  # no timeout: only an answer ends the WAIT
    if vals[1] is not None:
        raise closed_error(vals[1])
    assert vals[0] is not None
    return vals[0]


def say(msg: str) -> None:
    # The agent's line format (agent._log): the rendezvous has no logger of its own on stderr.
    print(f"[xrun-agent {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def by_slot(entries: list[Entry], max_nodes: int) -> list[Entry]:
    """``entries`` in group rank order: each on its slot, newcomers (rank rule order) on the
    free slots from the lowest, then closed up (see "Slot inheritance")."""
    placed: dict[int, Entry] = {}
    newcomers: list[Entry] = []
    for e in sorted(entries):
        slot = e[4]
        if 0 <= slot < max_nodes and slot not in placed:
            placed[slot] = e
        else:
            newcomers.append(e)
    free = (s for s in range(max_nodes) if s not in placed)
    for e, slot in zip(newcomers, free, strict=False):
        placed[slot] = e
    return [placed[s] for s in sorted(placed)]
