"""The etcd rendezvous's one state document (see ``etcd``): how a new round starts."""

from __future__ import annotations

from typing import Any

Member = list[Any]  # [addr, sortkey, nproc, node id, store address]


def fresh(rnd: int, why: str, me: Member | None, wait: list[str]) -> dict[str, Any]:
    """A round ``rnd`` nobody (or only ``me``) has joined yet. ``wait``: the ids of the last
    world's members still running; the round seals only once each has arrived in it or is gone
    (its lease ended), so that no two worlds of one job ever run at once. (torch's c10d
    rendezvous likewise opens the next round once the complete one's last participant left.)"""
    return {
        "round": rnd,
        "formed": False,
        "members": [me] if me is not None else [],
        "why": why,
        "fin": [],
        "closed": None,
        "wait": wait,
    }


def running(s: dict[str, Any], alive: set[str]) -> list[str]:
    """The members of the formed round in ``s`` that are alive and not finished."""
    if not s["formed"]:
        return []
    return [m[3] for m in s["members"] if m[3] in alive and m[3] not in s["fin"]]
