"""The etcd rendezvous's one state document (see ``etcd``): how a new round starts."""

from __future__ import annotations

from typing import Any

# [addr, sortkey, nproc, agent id, store address, slot, node id]: slot is the group rank the
# node held in its previous round with --spares (else -1), node id its XRUN_NODE_ID or host
# name (etcd_spares.py)
Member = list[Any]


def fresh(
    rnd: int, why: str, me: Member | None, wait: list[str], last: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A round ``rnd`` nobody (or only ``me``) has joined yet. ``wait``: the ids of the last
    world's members still running; the round seals only once each has arrived in it or is gone
    (its lease ended), so that no two worlds of one job ever run at once. (torch's c10d
    rendezvous likewise opens the next round once the complete one's last participant left.)
    ``last``: the state it follows, whose job-wide part (the quarantine) carries over."""
    return {
        "round": rnd,
        "formed": False,
        "members": [me] if me is not None else [],
        "why": why,
        "fin": [],
        "closed": None,
        "wait": wait,
        "quarantine": dict(last.get("quarantine") or {}) if last else {},
    }


def running(s: dict[str, Any], alive: set[str]) -> list[str]:
    """The members of the formed round in ``s`` that are alive and not finished."""
    if not s["formed"]:
        return []
    return [m[3] for m in s["members"] if m[3] in alive and m[3] not in s["fin"]]


def lost(s: dict[str, Any], alive: set[str]) -> list[Member]:
    """The members of the formed round in ``s`` whose lease ended before they finished (a
    member that finished and left is done, not lost)."""
    if not s["formed"]:
        return []
    return [m for m in s["members"] if m[3] not in alive and m[3] not in s["fin"]]
