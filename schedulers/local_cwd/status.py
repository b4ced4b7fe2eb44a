"""Reading a local_cwd app's state, from any process: describe, liveness, orphan clean-up.

``state.json`` is the supervisor's record. When the supervisor is gone before the app ended
(killed), the record is completed here from the replicas' liveness (pid + start time) and, for
a replica that ended, from its own exit record (``exit.json``, written by the runtime agent in
it): the replicas' records are the truth; a replica that left none ended UNKNOWN.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from xrun.procs import is_alive, pidfd_of
from xrun.specs import AppState, ReplicaStatus, Role, RoleStatus, appdef_from_dict, is_terminal

from ..api import DescribeAppResponse
from ..logs import root_cause_in
from . import statedir
from .procs import group_alive, killpg
from .supervisor import TERMINAL, grace_of, write_json_atomic

_REPLICA_STATES = {
    "PENDING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "STOPPING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
    "CANCELLED": AppState.CANCELLED,
}
# How long an app may go without a state file before its supervisor counts as never started
# (launch() itself waits this long for it; see launch._START_TIMEOUT_S).
_NEVER_STARTED_S = 90.0


def describe_app(app_id: str, paths: statedir.AppPaths) -> DescribeAppResponse | None:
    """The app's status from its files (+ a liveness check of its processes)."""
    req = statedir.read_request(paths.request)
    if req is None:
        return None
    st = statedir.read_state(paths.state)
    roles = appdef_from_dict(req["app"], paths.request).roles
    resp = DescribeAppResponse(app_id=app_id, roles=roles)
    if st is None:
        return _without_state(resp, paths)
    sup = st["supervisor"]
    orphaned = st["state"] not in TERMINAL and not is_alive(sup["pid"], sup["start"])
    if orphaned:
        # It may have written its last record and exited after our read: once it is dead, the
        # record on disk is its last word (the same supervisor: same pid and start time).
        st = statedir.read_state(paths.state) or st
        orphaned = st["state"] not in TERMINAL
    resp.state = AppState[st["state"]]
    resp.msg = st.get("msg", "")
    reps = st["replicas"]
    names = {role.name for role in roles}
    for i, r in enumerate(reps):  # _role_statuses files each replica under its role
        if r["role"] not in names:
            raise statedir.DamagedRecord(
                paths.state, f"replicas[{i}].role {r['role']!r:.40} is no role of the app"
            )
    states = [_REPLICA_STATES.get(r["state"], AppState.UNKNOWN) for r in reps]
    codes = [r["exit_code"] for r in reps]
    if orphaned:
        states, codes = _orphaned(resp, paths, st, states, codes, req)
    _disk_trouble(resp, paths, st)
    culprit = st.get("culprit")
    culprit = culprit if isinstance(culprit, int) and 0 <= culprit < len(reps) else None
    resp.roles_statuses = _role_statuses(resp, paths, roles, reps, states, codes, culprit)
    return resp


def _without_state(resp: DescribeAppResponse, paths: statedir.AppPaths) -> DescribeAppResponse:
    """No state.json: schedule() is starting the supervisor right now (SUBMITTED), or it never
    started (FAILED, once launch() would have given up waiting for it)."""
    try:
        age = time.time() - os.stat(paths.request).st_mtime
    except OSError:
        age = 0.0
    if age < _NEVER_STARTED_S:
        resp.state = AppState.SUBMITTED
        return resp
    resp.state = AppState.FAILED
    resp.msg = (
        f"its supervisor never started (no state {age:.0f}s after the submission); "
        f"see {paths.supervisor_log}"
    )
    return resp


def _disk_trouble(resp: DescribeAppResponse, paths: statedir.AppPaths, st: dict[str, Any]) -> None:
    """Say so when the supervisor could not write its record (a full disk), or, while the app
    runs, cannot: the disk is full now."""
    error = st.get("disk_error")
    if not error and st["state"] not in TERMINAL:
        try:
            vfs = os.statvfs(paths.state_dir)
        except OSError:
            return
        if vfs.f_bavail > 0:
            return
        error = f"No space left on device under {paths.app_dir}"
    if not error:
        return
    note = f"the supervisor could not keep its record up to date: {error}"
    resp.msg = f"{resp.msg}; {note}" if resp.msg else note


def _orphaned(
    resp: DescribeAppResponse,
    paths: statedir.AppPaths,
    st: dict[str, Any],
    states: list[AppState],
    codes: list[int | None],
    req: dict[str, Any],
) -> tuple[list[AppState], list[int | None]]:
    """The supervisor died before the app ended: each replica's state from its liveness, else
    its own exit record, else UNKNOWN; the app's from those (gang rules as the supervisor's)."""
    sup = st["supervisor"]
    reps = st["replicas"]
    alive = [is_alive(r["pid"], r["start"]) for r in reps]
    states, codes = list(states), list(codes)
    for i, r in enumerate(reps):
        if alive[i]:
            states[i] = AppState.RUNNING
        elif not is_terminal(states[i]):
            code = read_exit_record(paths.exit_record(r["role"], r["id"]))
            codes[i] = code
            states[i] = (
                AppState.UNKNOWN
                if code is None
                else (AppState.SUCCEEDED if code == 0 else AppState.FAILED)
            )
    died = f"the supervisor (pid {sup['pid']}) died before the app ended"
    if any(alive):
        resp.state = AppState.UNKNOWN
        resp.msg = (
            f"the supervisor (pid {sup['pid']}) is gone but {sum(alive)} replica(s) still "
            f"run; `xrun cancel` stops them (its log: {paths.supervisor_log})"
        )
        return states, codes
    unknown = sum(s == AppState.UNKNOWN for s in states)
    failed_roles = _failed_roles(reps, states, req)
    if failed_roles:
        resp.state = AppState.FAILED
        resp.msg = f"{died}; role(s) {', '.join(failed_roles)} failed (their exit records say)"
    elif unknown:
        resp.state = AppState.UNKNOWN
        resp.msg = (
            f"{died}; {unknown} replica(s) ended without an exit record, so how they ended is "
            f"unknown (see their logs, and {paths.supervisor_log})"
        )
    else:
        resp.state = AppState.SUCCEEDED
        resp.msg = f"{died}; every replica's exit record says it succeeded"
    return states, codes


def _failed_roles(
    reps: list[dict[str, Any]], states: list[AppState], req: dict[str, Any]
) -> list[str]:
    """Roles with more failed replicas than they may lose (the supervisor's gang rule)."""
    tolerate: dict[str, int] = dict(req.get("tolerate", {}))
    failures: dict[str, int] = {}
    for r, s in zip(reps, states, strict=True):
        if s == AppState.FAILED:
            failures[r["role"]] = failures.get(r["role"], 0) + 1
    return sorted(role for role, n in failures.items() if n > tolerate.get(role, 0))


def read_exit_record(path: str) -> int | None:
    """The exit code in a replica's ``exit.json``, or None (none written, or unreadable)."""
    try:
        data = statedir.read_json(path)
    except OSError:
        return None
    code = (data or {}).get("exitcode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _role_statuses(
    resp: DescribeAppResponse,
    paths: statedir.AppPaths,
    roles: list[Role],
    reps: list[dict[str, Any]],
    states: list[AppState],
    codes: list[int | None],
    culprit: int | None = None,
) -> list[RoleStatus]:
    """Each role's replicas; the app's error is the one of the replica the supervisor found
    the root cause in (``culprit``), else of the first failed one."""
    by_role: dict[str, RoleStatus] = {r.name: RoleStatus(r.name) for r in roles}
    order = sorted(range(len(reps)), key=lambda i: i != culprit)
    errs: dict[int, str] = {}
    for i in order:
        r = reps[i]
        err = ""
        if states[i] == AppState.FAILED:
            # the agent's root-cause line names the rank, which a worker's @record file,
            # copied into the agent's error file as torch does, does not
            err = root_cause_in(paths.log_file(r["role"], r["id"], "stderr"))
            err = err or statedir.read_error_summary(paths.error_file(r["role"], r["id"]))
            if not err and r.get("msg"):
                err = r["msg"]
            if err and not resp.structured_error_msg and resp.state == AppState.FAILED:
                resp.structured_error_msg = err
        errs[i] = err
    for i, (r, state, code) in enumerate(zip(reps, states, codes, strict=True)):
        err = errs[i]
        by_role[r["role"]].replicas.append(
            ReplicaStatus(
                id=r["id"],
                state=state,
                role=r["role"],
                hostname="localhost",
                exit_code=code,
                structured_error_msg=err,
            )
        )
    return list(by_role.values())


def supervisor_pidfd(paths: statedir.AppPaths) -> int | None:
    """A pidfd of the app's live supervisor (readable once it exits), or None (gone, or no
    pidfd here: the caller polls)."""
    st = statedir.read_state(paths.state)
    if st is None:
        return None
    sup = st["supervisor"]
    try:
        return pidfd_of(sup.get("pid"), sup["start"])
    except OSError:
        return None


def live_groups(st: dict[str, Any]) -> list[dict[str, Any]]:
    """The replicas whose process groups still have members."""
    return [r for r in st["replicas"] if group_alive(r["pid"], r["start"])]


def stop_orphans(paths: statedir.AppPaths, st: dict[str, Any], grace: float) -> None:
    """Cancel an app whose supervisor died: stop its replicas' process groups ourselves
    (SIGTERM, ``grace``, SIGKILL) and record CANCELLED (the caller checks that every process
    of the app ended)."""
    live = live_groups(st)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for r in live:
            killpg(r["pid"], sig)
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = live_groups({"replicas": live})
    for r in st["replicas"]:
        if r["state"] not in TERMINAL:
            r["state"] = "CANCELLED"
    st.update(
        state="CANCELLED",
        msg="cancelled by request (after the supervisor died)",
        ended_at=time.time(),
    )
    try:
        write_json_atomic(paths.state, st)
    except OSError:
        pass  # the processes are what matter; the caller checks them


def request_grace(paths: statedir.AppPaths) -> float:
    return grace_of(statedir.read_request(paths.request) or {})
