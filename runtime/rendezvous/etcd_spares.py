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
  marks itself ``left`` first and is not quarantined. The job-wide restart budget, and the
  quarantine of a node whose workers failed alone, are etcd_budget.py's.
* **Warm modules** (``--recover warm``): group rank 0's agent publishes the modules its
  workers import as one key, ``<prefix>/<run_id>/modules`` (the union so far, zlib-compressed;
  latest wins; one agent only, as every put wakes every watcher of the job), from a thread of
  its own so that a slow etcd never holds up the agent's watch loop; a standing-by spare reads
  it at each wake (the prefix watch sees it change) and hands the new names to its pool.
"""

from __future__ import annotations

import os
import socket
import zlib
from collections.abc import Callable
from typing import Any

from xrun.contract import NODE_ID_ENV

from .etcd_kv import EtcdClient, EtcdError
from .etcd_state import Member
from .sender import Sender
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


class ModulesPublisher(Sender[list[str], bytes]):
    """An active agent's side of "Warm modules" (sender.py): puts the union of every list so
    far under ``key`` (the client keeps one connection per thread), while ``hosting()`` (group
    rank 0's lists only: each put wakes every agent)."""

    ERRORS = (EtcdError, OSError)

    def __init__(self, etcd: EtcdClient, key: str, hosting: Callable[[], bool]) -> None:
        super().__init__()
        self._etcd, self._key, self._hosting = etcd, key, hosting
        self._names: dict[str, None] = {}
        self._dirty = False

    def __call__(self, news: list[str]) -> None:
        if self._hosting():
            super().__call__(news)

    def _add(self, names: list[str]) -> None:
        self._names.update(dict.fromkeys(names))
        self._dirty = True

    def _take(self) -> bytes | None:
        if not self._dirty:
            return None
        self._dirty = False
        return zlib.compress("\n".join(self._names).encode())

    def _keep(self, item: bytes) -> None:
        self._dirty = True  # the union, newer names and all, goes again

    def _send(self, item: bytes) -> None:
        self._etcd.put(self._key, item)
