"""The etcd rendezvous's one state document (see ``etcd``): how a new round starts."""

from __future__ import annotations

from typing import Any

# [addr, sortkey, nproc, agent id, store address, slot, node id]: slot is the group rank the
# node held in its previous round with --spares (else -1), node id its XRUN_NODE_ID or host
# name (etcd_spares.py)
Member = list[Any]


def fresh(
    rnd: int,
    why: str,
    me: Member | None,
    wait: list[str],
    last: dict[str, Any] | None = None,
    spares: int = 0,
) -> dict[str, Any]:
    """A round ``rnd`` nobody (or only ``me``) has joined yet. ``wait``: the ids of the last
    world's members still running; the round seals only once each has arrived in it or is gone
    (its lease ended), so that no two worlds of one job ever run at once. (torch's c10d
    rendezvous likewise opens the next round once the complete one's last participant left.)
    ``last``: the state it follows, whose job-wide part (quarantine, agents that left on
    purpose, the restart budget, the lone-failure records) carries over; with ``spares`` so does
    the last world's member list (``prev``: the sealer quarantines a member of it that never
    arrived, etcd_spares.py)."""
    s: dict[str, Any] = {
        "round": rnd,
        "formed": False,
        "members": [me] if me is not None else [],
        "why": why,
        "fin": [],
        "closed": None,
        "wait": wait,
        "quarantine": dict(last.get("quarantine") or {}) if last else {},
        "left": list(last.get("left") or []) if last else [],
    }
    if last and last.get("budget"):  # the job-wide restart budget (etcd_budget.py)
        s["budget"] = dict(last["budget"])
    if last and last.get("lone"):  # the lone-failure records and counts (etcd_budget.py)
        s["lone"] = dict(last["lone"])
    if spares and last:
        s["prev"] = last["members"] if last["formed"] else list(last.get("prev") or [])
    return s


def running(s: dict[str, Any], alive: set[str]) -> list[str]:
    """The members of the formed round in ``s`` that are alive and not finished."""
    if not s["formed"]:
        return []
    return [m[3] for m in s["members"] if m[3] in alive and m[3] not in s["fin"]]


def lost(s: dict[str, Any], alive: set[str]) -> list[Member]:
    """The members of the formed round in ``s`` whose lease ended before they finished (a
    member that finished, or left on purpose, is done, not lost)."""
    if not s["formed"]:
        return []
    left = set(s.get("left") or ())
    return [m for m in s["members"] if m[3] not in alive and m[3] not in set(s["fin"]) | left]


def stayed_away(s: dict[str, Any], alive: set[str]) -> list[Member]:
    """The last world's members (``prev``) that the unformed round in ``s`` waited for and that
    are gone without arriving or leaving on purpose: lost while their peers re-formed (a
    survivor's workers failed first, and asked for the round, before the lease ran out)."""
    ids = {m[3] for m in s["members"]}
    left = set(s.get("left") or ())
    wait = set(s.get("wait") or ())
    return [
        m
        for m in s.get("prev") or ()
        if m[3] in wait and m[3] not in alive and m[3] not in ids | left
    ]


def waiting(s: dict[str, Any], alive: set[str]) -> int:
    """How many of the last world's members the unformed round in ``s`` still waits for."""
    ids = {m[3] for m in s["members"]}
    return sum(1 for w in s.get("wait") or () if w in alive and w not in ids)
