"""What the docker scheduler reads off the engine's containers: statuses, the end message, the
job record of an app submitted elsewhere, and whole log lines. No SDK import: the functions take
the SDK's container objects (``.name``, ``.labels``, ``.attrs``) as they come.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from xrun.specs import AppState, ReplicaStatus, RoleStatus

from ..logs import root_cause_of
from .request import (
    LABEL_APP,
    LABEL_MAY_LOSE,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_SESSION,
    app_state,
    replica_state,
)
from .statedir import StateDir


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines ("\\n"-terminated, like a file's) from docker's arbitrarily cut chunks."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *done, buf = buf.split(b"\n")
        for line in done:
            yield line.decode("utf-8", "replace") + "\n"
    if buf:
        yield buf.decode("utf-8", "replace") + "\n"


def job_from_containers(app_id: str, containers: list[Any]) -> dict[str, Any]:
    """``job.json``'s shape, rebuilt from the engine's view of the containers."""
    specs = []
    for c in sorted(containers, key=lambda c: c.name):
        config = c.attrs.get("Config") or {}
        specs.append(
            {
                "name": c.name,
                "role": c.labels[LABEL_ROLE],
                "replica_id": int(c.labels[LABEL_REPLICA]),
                "image": config.get("Image", ""),
                "command": list(config.get("Entrypoint") or []) + list(config.get("Cmd") or []),
            }
        )
    first = containers[0].labels if containers else {}
    return {
        "app_id": app_id,
        "app_name": first.get(LABEL_APP, ""),
        "session": first.get(LABEL_SESSION, ""),
        "containers": specs,
    }


def containers_app_state(
    containers: list[Any], cancelled: bool, states: dict[str, AppState] | None = None
) -> AppState:
    """The app's state from its containers (``states``: their states by name, if already
    read); an elastic role's allowance of failed replicas comes from its containers' label."""
    states = states or {c.name: replica_state(c.attrs)[0] for c in containers}
    may_lose = {c.labels[LABEL_ROLE]: int(c.labels.get(LABEL_MAY_LOSE, 0)) for c in containers}
    pairs = [(c.labels[LABEL_ROLE], states[c.name]) for c in containers]
    return app_state(pairs, cancelled, may_lose)


def role_statuses(containers: list[Any], stopped: set[str]) -> list[RoleStatus]:
    """Per-role replica statuses; a replica in ``stopped`` was stopped by xrun (CANCELLED)."""
    roles: dict[str, list[ReplicaStatus]] = {}
    for c in containers:
        state, code = replica_state(c.attrs)
        if c.name in stopped:
            state = AppState.CANCELLED
        role = c.labels[LABEL_ROLE]
        roles.setdefault(role, []).append(
            ReplicaStatus(
                id=int(c.labels[LABEL_REPLICA]),
                state=state,
                role=role,
                hostname=c.name,
                exit_code=code,
            )
        )
    return [
        RoleStatus(role=r, replicas=sorted(reps, key=lambda x: x.id))
        for r, reps in sorted(roles.items())
    ]


def end_message(
    app_id: str,
    state: AppState,
    roles: list[RoleStatus],
    state_dir: StateDir,
    containers_gone: bool,
) -> str:
    if containers_gone:
        return f"the containers of {app_id} are gone (removed outside xrun?)"
    if state == AppState.CANCELLED:
        return "cancelled"
    if state not in (AppState.FAILED, AppState.SUCCEEDED):
        return ""
    parts = []
    for r in roles:
        for rep in r.replicas:
            if rep.state != AppState.FAILED:
                continue
            last = [
                line.rstrip("\n")
                for line in state_dir.read_logs(app_id, r.role, rep.id, ["stderr"], None, None)
                if line.strip()
            ]
            cause = root_cause_of(last[-8:])  # the runtime agent names it in its last lines
            if cause:
                rep.structured_error_msg = cause
                hint = f": {cause}"
            else:
                hint = f" (last stderr line: {last[-1][:200]})" if last else ""
            parts.append(f"replica {r.role}/{rep.id} exited with code {rep.exit_code}{hint}")
    if state == AppState.SUCCEEDED:  # failures an elastic role (or spares) was allowed
        tail = " (the role went on with fewer replicas: elastic, or a spare took the place)"
        return "; ".join(parts) + tail if parts else ""
    stopped = sum(rep.state == AppState.CANCELLED for r in roles for rep in r.replicas)
    tail = f"; stopped the other {stopped} replica(s)" if stopped else ""
    return "; ".join(parts) + tail
