"""Warm spares on the etcd rendezvous (``--spares S --rdzv-backend etcd``): spares.py's rules, kept
in the job's etcd state document instead of a store that one agent serves, so that any node,
group rank 0 included, can be lost and replaced (with c10d the store's host cannot).

* **Who is a spare**: as with c10d, an agent that arrives while the world is full. It stands by
  next to the formed round on an etcd watch of the job's keys (renewed every 5 s; besides that
  and its lease's renewals it does nothing) and, unlike a node that is merely extra, without
  ``join_timeout``; when a member is lost it starts the next round (or joins the one the
  survivors started) and the world re-forms. It takes a seat in a new round only if one is
  free once the last world's members still stopping their workers have theirs, so a worker
  failure (every member re-forms) leaves it standing by, and two spares never fill a round
  before a survivor arrives.
* **Slot inheritance**: each member entry carries the group rank its node held in its previous
  round (its slot, -1 for a newcomer); the round is sealed with ``spares.by_slot``, so a spare
  that replaces group rank 0 becomes group rank 0 and every ``RANK`` stays where it was.
* **Quarantine**: a lost member's node id (``XRUN_NODE_ID``, else the host name) goes into the
  state's ``quarantine`` (it carries over from round to round); an agent of that node is refused
  at its first look with budget.py's one line. Whoever sees the loss first writes it in the
  same compare-and-set as the new round: a survivor's watcher or a spare, when a formed
  round's member is lost; the sealer, when the new round waited for a member of the last world
  (``prev``) that never arrived (a survivor's workers failed first and asked for the round
  before the lost node's lease ran out). An agent that leaves on purpose (shutdown mid-round)
  marks itself ``left`` first and is not quarantined. The job-wide restart budget is
  etcd_budget.py's.
* **Warm modules** (``--recover warm``): group rank 0's agent publishes the modules its
  workers import as one key, ``<prefix>/<run_id>/modules`` (the union so far, zlib-compressed;
  latest wins; one agent only, as every put wakes every watcher of the job), from a thread of
  its own so that a slow etcd never holds up the agent's watch loop; a standing-by spare reads
  it at each wake (the prefix watch sees it change) and hands the new names to its pool.
"""

from __future__ import annotations

import os
import socket
import threading
import zlib
from typing import Any

from xrun.contract import NODE_ID_ENV

from .etcd_kv import EtcdClient, EtcdError
from .etcd_state import Member
from .spares import by_slot

__all__ = [
    "ModulesPublisher",
    "node_id",
    "quarantine",
    "refuse_quarantined",
    "seal",
    "slot_of",
    "took",
]

RETRY_S, RETRIES = 1.0, 5  # a list etcd did not take: again after, at most


def node_id() -> str:
    return os.environ.get(NODE_ID_ENV) or socket.gethostname()


def slot_of(m: Member) -> int:
    return int(m[5]) if len(m) > 5 else -1


def seal(members: list[Member], max_nodes: int, spares: int) -> list[Member]:
    """``members`` in group rank order. With spares each on its slot, newcomers (by address
    and sort key) on the free slots from the lowest, then closed up; else the rank rule:
    by address and sort key."""
    if not spares:
        return sorted(members, key=lambda m: (m[0], m[1]))
    entries = [(str(m[0]), str(m[1]), i, int(m[2]), slot_of(m)) for i, m in enumerate(members)]
    return [members[e[2]] for e in by_slot(entries, max_nodes)]


def quarantine(state: dict[str, Any], gone: list[Member], rnd: int) -> dict[str, Any]:
    """``state`` (a new round's) with the node ids of ``gone`` (lost in round ``rnd``) added
    to its quarantine: ``node id -> "host<TAB>why"`` (budget.refusal's form)."""
    q = dict(state.get("quarantine") or {})
    for m in gone:
        if len(m) > 6 and m[6]:
            q.setdefault(str(m[6]), f"{m[0]}\tits agent was lost in round {rnd}")
    return {**state, "quarantine": q}


def refuse_quarantined(state: dict[str, Any], node: str, run_id: str) -> None:
    """Raise budget.py's one line if ``node`` is in ``state``'s quarantine."""
    why = (state.get("quarantine") or {}).get(node) if node else None
    if why:
        from .budget import refusal

        raise refusal(node, run_id, str(why).encode())


def took(value: bytes, seen: set[str]) -> list[str]:
    """The names in a published ``value`` not in ``seen`` (added to it)."""
    names = [n for n in zlib.decompress(value).decode().split("\n") if n and n not in seen]
    seen.update(names)
    return names


class ModulesPublisher:
    """An active agent's side of "Warm modules": calling it never blocks; a daemon thread puts
    the union of every list so far under ``key`` (the client keeps one connection per thread)."""

    def __init__(self, etcd: EtcdClient, key: str) -> None:
        self._etcd, self._key = etcd, key
        self._cond = threading.Condition()
        self._names: dict[str, None] = {}
        self._dirty = self._stopped = False
        self._thread: threading.Thread | None = None

    def __call__(self, names: list[str]) -> None:
        with self._cond:
            if self._stopped:
                return
            self._names.update(dict.fromkeys(names))
            self._dirty = True
            self._cond.notify()
            if self._thread is None:  # started on the first list: most jobs never publish
                self._thread = threading.Thread(
                    target=self._run, name="xrun-spare-modules", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._dirty and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                self._dirty = False
                value = zlib.compress("\n".join(self._names).encode())
            try:
                self._etcd.put(self._key, value)
                failures = 0
            except (EtcdError, OSError):
                # best effort: etcd's loss is seen by the rendezvous itself; tried again
                failures += 1
                with self._cond:
                    if failures > RETRIES:
                        failures = 0  # given up on this list: the next one starts afresh
                        continue
                    self._dirty = True
                    self._cond.wait(RETRY_S)  # close() wakes it

    def close(self, timeout: float = 1.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
