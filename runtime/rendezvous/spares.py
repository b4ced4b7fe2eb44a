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

**Warm modules** (``--recover warm``). A spare's pool never ran the script, so its children
would hold ``torch`` alone, and the replacement's workers would import the rest (``torch._dynamo``,
``sympy`` ... that ``use_deterministic_algorithms`` and DDP load: 10-25 s of CPU on a busy
2-core host) while every survivor waits for them in ``init_process_group`` (issue #35). So the
active agents ``share`` the modules their workers reported (``pool.py``) in the store: each
new list under ``<run_id>/kv/spare-modules/<n>`` (n from an ADD on ``.../n``); a parked spare
adds the next ``n`` to each blocking ``WAIT`` and hands every list to its pool (``took``),
whose idle children import it. Still no polling: one more key per ``WAIT``.

Publishing is a side feature and must never hold up the agent's watch loop (worker exits, stop
requests, the round's heartbeats, the stall watchdog): a store that stops answering (its host
SIGSTOPped, packets dropped) would block each ADD/SET up to the store's ``read_timeout``. So the
pool hands each list to a ``Publisher`` (sender.py), whose one daemon thread sends it on a
connection of its own (the agent's other calls never queue behind its reads): latest list wins
(each one holds the ones before), one in flight at a time, errors swallowed (best effort: the
rendezvous calls see a lost store) and the list tried again a few times, into the slot its ADD
counted (a slot never written would stop the spares at it); ``close`` on the handler's shutdown
stops it (bounded join; a daemon never holds up the exit).
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable

from ..stopping import STOP_MARK
from ..store.client import StoreClient
from ..store.errors import StoreError
from .api import RendezvousClosedError, RendezvousError
from .keys import Keys, Seat, World, closed_error
from .kv import KeyValue
from .sender import Closed, Sender

__all__ = ["Modules", "Publisher", "by_slot", "park", "say", "share"]

# (addr, sortkey, arrival index, nproc, slot), as the sealer reads the node entries
Entry = tuple[str, str, int, int, int]


_MODULES = "spare-modules/"  # under the agents' own keys (kv.KeyValue: <run_id>/kv/)


def share(kv: KeyValue, names: list[str]) -> None:
    """An active agent: publish ``names`` (the modules its workers reported) to the spares."""
    n = kv.add(_MODULES + "n", 1)
    kv.set(f"{_MODULES}{n}", zlib.compress("\n".join(names).encode()))


class Publisher(Sender[list[str], list[str]]):
    """An active agent's ``share``, off its watch loop (see "Warm modules" and sender.py):
    ``open_client`` (a new store connection, called in the thread: connecting to a hung store
    blocks too) and ``run_id`` name where the lists go; the latest list wins (each one holds
    the ones before)."""

    ERRORS = (RendezvousError, StoreError, OSError)

    def __init__(self, open_client: Callable[[], StoreClient], run_id: str) -> None:
        super().__init__()
        self._open, self._run_id = open_client, run_id
        self._names: list[str] | None = None  # the latest list, not sent yet
        self._client: StoreClient | None = None
        self._kv: KeyValue | None = None  # the thread's
        self._slot: int | None = None  # the list's slot, counted (ADD) and not yet written

    def _add(self, names: list[str]) -> None:
        self._names = list(names)

    def _take(self) -> list[str] | None:
        names, self._names = self._names, None
        return names

    def _keep(self, item: list[str]) -> None:
        if self._names is None:
            self._names = item

    def _send(self, item: list[str]) -> None:
        if self._kv is None:
            client = self._open()
            with self._cond:
                self._client = client
                if self._stopped:  # closed while we connected
                    client.close()
                    raise Closed
            self._kv = KeyValue(client, self._run_id)
        if self._slot is None:
            self._slot = self._kv.add(_MODULES + "n", 1)
        # A slot counted and never written would stop the spares at it for good (they wait
        # for the slots in order): a list that failed after its ADD keeps its slot, and so
        # does the next list when this one is given up.
        self._kv.set(f"{_MODULES}{self._slot}", zlib.compress("\n".join(item).encode()))
        self._slot = None

    def _drop_link(self) -> None:
        if self._kv is not None:
            self._kv.close()
        self._kv = None

    def _wake(self) -> None:
        with self._cond:
            client = self._client
        if client is not None:
            client.abort()  # wakes a call blocked on a hung store


class Modules:
    """A parked spare's reader of the shared module lists: ``key`` is the next one's key."""

    def __init__(self, c: StoreClient, run_id: str, took: Callable[[list[str]], None]) -> None:
        self._c, self._took = c, took
        self._prefix = f"{run_id}/kv/{_MODULES}"
        self.key = ""
        # the lists shared before we came: all at once, then one key per WAIT
        n = int(c.get(self._prefix + "n") or 0)
        self.take([v for v in c.multi_get([f"{self._prefix}{i}" for i in range(1, n + 1)]) if v])
        self._next(n + 1)

    def _next(self, n: int) -> None:
        self._n, self.key = n, f"{self._prefix}{n}"

    def take(self, values: list[bytes]) -> None:
        names: dict[str, None] = {}
        for v in values:
            names.update(dict.fromkeys(zlib.decompress(v).decode().split("\n")))
        names.pop("", None)
        if names:
            self._took(list(names))

    def arrived(self, value: bytes) -> None:
        self.take([value])
        self._next(self._n + 1)


def park(
    c: StoreClient,
    k: Keys,
    rnd: int,
    notify: Callable[[int, int], None],
    took: Callable[[list[str]], None] | None = None,
) -> None:
    """Block until round ``rnd`` formed, went stale and every member of it left it: then a
    spare may take an index in round ``rnd + 1``. ``notify(rnd, nodes)`` on the formed world:
    one with room (an elastic job) re-forms to take the spare in. ``took(names)``: the module
    lists the active agents share, as they come (see "Warm modules"). Raises the job's verdict
    (``RendezvousClosedError``) when it closes meanwhile."""
    mods = Modules(c, k.prefix.removesuffix("/rdzv/"), took) if took is not None else None
    world = _wait_one(c, k, k.of(rnd, "world"), mods)
    notify(rnd, Seat.parse(world).nodes)
    say(f"standing by as a spare: the world of round {rnd} is full")
    stale = _wait_one(c, k, k.of(rnd, "stale"), mods).decode(errors="replace")
    if STOP_MARK in stale:
        # A stop request ends the job (the members close it once their workers saved): leave
        # now, with the request as the reason (the agent exits 128 + its signal, as the
        # members do), rather than try for a seat and lose the store to the host's exit.
        raise RendezvousClosedError(stale, failed=True)
    # Every member out of it: one WAIT for all the left keys, renewed each second to see the
    # job close meanwhile (this lasts while the survivors re-form: seconds), not one WAIT per
    # member: 16,384 round trips in a 16,384-node job (benchmarks/rdzv_replace.py).
    members = World.parse(rnd, _wait_one(c, k, k.of(rnd, "members"), mods))
    left = [k.of(rnd, f"left/{i}") for i in members.indices if i]
    while left and c.wait(left, timeout=1.0) is None:
        closed = c.get(k.closed)
        if closed is not None:
            raise closed_error(closed)
    say(f"round {rnd} went stale and its members left it: trying for a seat in round {rnd + 1}")


def _wait_one(c: StoreClient, k: Keys, key: str, mods: Modules | None = None) -> bytes:
    while True:
        keys = [key, k.closed, *([mods.key] if mods else [])]
        vals = c.wait(keys, want_all=False, timeout=None)
        assert vals is not None  # no timeout: only an answer ends the WAIT
        if vals[1] is not None:
            raise closed_error(vals[1])
        if vals[0] is not None:
            return vals[0]
        assert mods is not None and vals[2] is not None
        mods.arrived(vals[2])


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
