"""Reading a local_cwd app's state, from any process: describe, liveness, orphan clean-up.

``state.json`` is the supervisor's record. When the supervisor is gone before the app ended
(killed), the record is completed here from the replicas' liveness (pid + start time).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from xrun.specs import AppState, ReplicaStatus, RoleStatus, appdef_from_dict, is_terminal

from ..api import DescribeAppResponse
from ..logs import POLL_S
from . import store
from .launch import killpg
from .supervisor import TERMINAL, is_alive, write_json_atomic

_REPLICA_STATES = {
    "PENDING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "STOPPING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
    "CANCELLED": AppState.CANCELLED,
}


def describe_app(app_id: str, paths: store.AppPaths) -> DescribeAppResponse | None:
    """The app's status from its files (+ a liveness check of its processes)."""
    req = store.read_json(paths.request)
    if req is None:
        return None
    st = store.read_json(paths.state)
    roles = appdef_from_dict(req["app"], paths.request).roles
    resp = DescribeAppResponse(app_id=app_id, roles=roles)
    if st is None:  # schedule() is starting the supervisor right now
        resp.state = AppState.SUBMITTED
        return resp
    resp.state = AppState[st["state"]]
    resp.msg = st.get("msg", "")
    reps = st["replicas"]
    states = [_REPLICA_STATES.get(r["state"], AppState.UNKNOWN) for r in reps]
    sup = st["supervisor"]
    if st["state"] not in TERMINAL and not is_alive(sup["pid"], sup["start"]):
        alive = [is_alive(r["pid"], r["start"]) for r in reps]
        states = [
            AppState.RUNNING if a else (s if is_terminal(s) else AppState.UNKNOWN)
            for a, s in zip(alive, states, strict=True)
        ]
        if any(alive):
            resp.state = AppState.UNKNOWN
            resp.msg = (
                f"the supervisor (pid {sup['pid']}) is gone but {sum(alive)} replica(s) still "
                f"run; `xrun cancel` stops them (its log: {paths.supervisor_log})"
            )
        else:
            resp.state = AppState.FAILED
            resp.msg = (
                f"the supervisor (pid {sup['pid']}) died before the app ended; "
                f"see {paths.supervisor_log}"
            )
    by_role: dict[str, RoleStatus] = {r.name: RoleStatus(r.name) for r in roles}
    for r, state in zip(reps, states, strict=True):
        err = ""
        if state == AppState.FAILED:
            err = store.read_error_summary(paths.error_file(r["role"], r["id"]))
            if not err and r.get("msg"):
                err = r["msg"]
            if err and not resp.structured_error_msg and resp.state == AppState.FAILED:
                resp.structured_error_msg = err
        by_role[r["role"]].replicas.append(
            ReplicaStatus(
                id=r["id"],
                state=state,
                role=r["role"],
                hostname="localhost",
                exit_code=r["exit_code"],
                structured_error_msg=err,
            )
        )
    resp.roles_statuses = list(by_role.values())
    return resp


def supervisor_pidfd(paths: store.AppPaths) -> int | None:
    """A pidfd of the app's live supervisor (readable once it exits), or None."""
    st = store.read_json(paths.state)
    if st is None or not hasattr(os, "pidfd_open"):
        return None
    sup = st["supervisor"]
    try:
        fd = os.pidfd_open(sup["pid"])
    except OSError:
        return None
    # Checked after opening: the fd now pins the process, so a pid reused in between
    # shows up as a start-time mismatch instead of going unnoticed.
    if not is_alive(sup["pid"], sup["start"]):
        os.close(fd)
        return None
    return fd


def stop_orphans(paths: store.AppPaths, st: dict[str, Any], grace: float) -> None:
    """Cancel an app whose supervisor died: stop its replicas ourselves and record CANCELLED."""
    live = [r for r in st["replicas"] if is_alive(r["pid"], r["start"])]
    for r in live:
        killpg(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(POLL_S)
        live = [r for r in live if is_alive(r["pid"], r["start"])]
    for r in live:
        killpg(r["pid"], signal.SIGKILL)
    for r in st["replicas"]:
        if r["state"] not in TERMINAL:
            r["state"] = "CANCELLED"
    st.update(
        state="CANCELLED",
        msg="cancelled by request (after the supervisor died)",
        ended_at=time.time(),
    )
    write_json_atomic(paths.state, st)
