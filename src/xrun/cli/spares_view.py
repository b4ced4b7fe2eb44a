"""``xrun status``'s lines for a job with spares (``dist.ddp --spares S``): which replicas stood by
as spares and which of them took a lost node's group rank, the job-wide restart budget, and the
nodes the runtime quarantined.

The facts come from the replicas' agent stderr (every scheduler keeps it after the job, from any
shell: what ``xrun log`` reads), in the words the runtime prints them (runtime/rendezvous/
spares.py, rounds.py, budget.py); the rendezvous store, which holds them while the job runs,
lives in replica 0's agent and is gone with it. Read only for an app whose role says it has
spares (the ``xrun.spares`` metadata, or ``--spares`` in the agent's command line), so
``status`` of any other app reads no log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from xrun.contract import SPARES
from xrun.specs import AppDef, AppState, AppStatus, Role

_FLAG = re.compile(r"xrun\.runtime .*--spares (\d+)")
_PARKED = re.compile(r"standing by as a spare: the world of round \d+ is full")
_TOOK = re.compile(r"a spare no more: took group rank (\d+) in round (\d+)")
_BUDGET = re.compile(r"restart budget(?: spent)?: (\d+) of (\d+) restarts used")
_QUARANTINE = re.compile(r"node (\S+) \(host (\S+)\) (?:is )?quarantined(?: from job \S+)?:? (.*)")


def _spares_of(role: Role) -> int:
    """The role's spares: its metadata (dist.ddp), else the agent's ``--spares`` in its command
    (a scheduler that rebuilds roles from what runs, docker's containers, keeps no metadata)."""
    if role.metadata.get(SPARES):
        return int(role.metadata[SPARES])
    m = _FLAG.search(" ".join([role.entrypoint, *role.args]))
    return int(m.group(1)) if m else 0


def spares_lines(
    app: AppDef | None, status: AppStatus, read: Callable[[str, int], Iterable[str]]
) -> list[str]:
    """The lines to print (none for an app without spares); ``read(role, k)``: replica k's
    agent stderr lines."""
    out: list[str] = []
    roles = {r.name: _spares_of(r) for r in (app.roles if app else [])}
    for rs in status.roles:
        spares = roles.get(rs.role, 0)
        if not spares:
            continue
        parked: list[int] = []
        took: list[tuple[int, str, str]] = []
        used, budget, quarantined = -1, -1, {}
        for rep in rs.replicas:
            for line in read(rs.role, rep.id):
                if _PARKED.search(line) and rep.id not in parked:
                    parked.append(rep.id)
                elif m := _TOOK.search(line):
                    took.append((rep.id, m.group(1), m.group(2)))
                elif m := _BUDGET.search(line):
                    used, budget = max(used, int(m.group(1))), int(m.group(2))
                elif m := _QUARANTINE.search(line):
                    quarantined[m.group(1)] = f"host {m.group(2)}: {m.group(3).strip()}"[:200]
        lost = [f"{rs.role}/{r.id}" for r in rs.replicas if r.state == AppState.FAILED]
        n_used = len({k for k, _, _ in took})
        out.append(
            f"Spares ({rs.role}): {spares}; {n_used} used, {max(spares - n_used, 0)} idle"
            + (f"; stood by: {', '.join(f'{rs.role}/{k}' for k in parked)}" if parked else "")
        )
        for k, rank, rnd in took:
            out.append(f"  {rs.role}/{k} took group rank {rank} in round {rnd}")
        if took and lost:
            out.append(f"  lost: {', '.join(lost)}")
        if budget >= 0:
            out.append(
                f"Budget: {used} of {budget} restarts used, {max(budget - used, 0)} left (job-wide)"
            )
        for node, why in quarantined.items():
            out.append(f"Quarantined: node {node} ({why})")
    return out
