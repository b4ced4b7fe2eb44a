"""The detached supervisor of one sweep whose trials are normal apps (local_cwd, docker, ...).

Started by :func:`xrun.sweeps.trials.TrialsBackend.submit` in a session of its own::

    python -m xrun.sweeps.supervisor SWEEP_DIR

so ``xrun run`` returns the sweep's handle at once and the sweep goes on without it. In a loop
it: submits the next trials (in order) while fewer than K run; asks each running trial's app
for its status (``Scheduler.wait(app_id, 0)``, which also reaps a local_cwd app's supervisor
forked from here); honours cancel requests (``SWEEP_DIR/cancel/<trial>``; ``all``, or SIGTERM:
every trial); and records every trial in ``SWEEP_DIR/state.json`` (atomically, after each
change). A trial whose submit fails is FAILED with the reason; the others go on. It sleeps
``POLL_S`` between rounds, woken at once by a signal (``cancel`` sends SIGUSR1).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from xrun.errors import XrunError
from xrun.procs import proc_start_time
from xrun.schedulers.api import DescribeAppResponse, Scheduler, get_scheduler
from xrun.specs import AppDef, AppState, is_terminal
from xrun.sweeps import records
from xrun.sweeps.plan import SweepPlan

SUPERVISOR_FILE = records.SUPERVISOR_FILE
POLL_S = 0.25
_LIVE = {"UNSUBMITTED", "SUBMITTED", "PENDING", "RUNNING"}
# How long the sweep supervisor keeps asking a trial's app that says UNKNOWN: past this it
# stops waiting for it (and may exit), which changes nothing anyone sees, since the sweep's
# table asks such a trial's app itself (trials.TrialsBackend.status); a supervisor must never
# stay forever for an app whose own supervisor is gone and whose replicas left no exit record.
UNKNOWN_WAIT_S = 300.0


def unsettled(t: dict[str, Any]) -> bool:
    """Whether trial ``t`` may still change: waiting or running, or UNKNOWN while its app may
    still end (its own supervisor died while its replicas ran: the app's status settles from
    their exit records later), for at most UNKNOWN_WAIT_S. UNKNOWN with an end time (its app is
    gone) is final."""
    if t["state"] in _LIVE:
        return True
    return t["state"] == "UNKNOWN" and t["ended"] is None and not t.get("abandoned")


# --------------------------------------------------------------------------- the state file
def _new_trial() -> dict[str, Any]:
    return {
        "state": "PENDING",
        "app_id": "",
        "exit_code": None,
        "host": "",
        "started": None,
        "ended": None,
        "msg": "",
    }


def initial_state(size: int) -> dict[str, Any]:
    return {"msg": "", "trials": [_new_trial() for _ in range(size)]}


def load_state(path: str, size: int) -> dict[str, Any] | None:
    return records.load_state(path, size)


def save_state(path: str, state: dict[str, Any]) -> None:
    records.write_json(os.path.join(path, records.STATE_FILE), state)


def trial_app(plan: SweepPlan, index: int) -> AppDef:
    """Trial ``index`` as the app it runs as: ``<name>-<index>``."""
    app = plan.app(index)
    app.name = f"{plan.name}-{index}"
    return app


def record(
    t: dict[str, Any],
    resp: DescribeAppResponse | None,
    seen_end: Callable[[], float] | None = None,
) -> bool:
    """Update trial ``t`` from its app's status; whether anything changed. ``seen_end``: the
    trial's end time once it has ended (:func:`records.first_end`, so the supervisor and a
    status that saw the end first agree on it); by default, now."""
    seen_end = seen_end or time.time
    if resp is None:
        t.update(state="UNKNOWN", ended=seen_end(), msg=f"its app {t['app_id']} is gone")
        return True
    if resp.state == AppState.UNKNOWN:
        since = t.setdefault("unknown_since", time.time())
        if not t.get("abandoned") and time.time() - since > UNKNOWN_WAIT_S:
            t["abandoned"] = True  # see UNKNOWN_WAIT_S
            return True
    else:
        t.pop("unknown_since", None)
    if resp.state.name == t["state"]:
        return False
    t["state"] = resp.state.name
    replicas = [r for rs in resp.roles_statuses for r in rs.replicas]
    if replicas and replicas[0].hostname:
        t["host"] = replicas[0].hostname
    if is_terminal(resp.state):
        t["ended"] = seen_end()
        failed = [r.exit_code for r in replicas if r.state == AppState.FAILED]
        others = [r.exit_code for r in replicas if r.exit_code not in (None, 0)]
        if resp.state == AppState.SUCCEEDED:
            t["exit_code"] = 0
        else:
            t["exit_code"] = next((c for c in failed + others if c is not None), None)
        if resp.state == AppState.FAILED:
            t["msg"] = resp.structured_error_msg or resp.msg
    return True


def cancel_everything(path: str, sched: Scheduler[Any], state: dict[str, Any]) -> None:
    """Cancel every trial: those not started never will, the running ones are stopped (all at
    once: each cancel waits for its app's grace period)."""
    now = time.time()
    live = [(i, t) for i, t in enumerate(state["trials"]) if unsettled(t)]
    if not live:
        return  # it had ended: nothing to cancel, nothing to record
    running = []
    for i, t in live:
        if t["app_id"]:
            running.append((i, t))
        else:
            t.update(state="CANCELLED", ended=now, msg="cancelled by request")
    if running:
        # first_end: a trial that ended meanwhile may have been seen ended by a status first,
        # whose end time the table showed; the supervisor's own clock would move its duration
        with ThreadPoolExecutor(max_workers=min(len(running), 16)) as pool:
            list(
                pool.map(
                    lambda it: cancel_app(sched, it[1], partial(records.first_end, path, it[0])),
                    running,
                )
            )
    state["msg"] = "cancelled by request"
    save_state(path, state)


def cancel_app(
    sched: Scheduler[Any],
    t: dict[str, Any],
    seen_end: Callable[[], float] | None = None,
    strict: bool = False,
) -> None:
    """Cancel trial ``t``'s app and record how it ended: what its scheduler says (an app that
    had ended on its own keeps its own end), else CANCELLED. A cancel that fails is noted in
    the trial's msg, or with ``strict`` raised before anything is recorded (the app may still
    run: a later status asks it again)."""
    try:
        sched.cancel(t["app_id"])
        record(t, sched.describe(t["app_id"]), seen_end)
    except XrunError as e:
        if strict:
            raise
        t["msg"] = f"cancel failed: {e}"
    if unsettled(t):  # its scheduler does not say yet: it was told to stop
        t.update(state="CANCELLED", ended=(seen_end or time.time)())


# --------------------------------------------------------------------------- the supervisor
class TrialsSupervisor:
    def __init__(self, path: str) -> None:
        self.path = path
        spec = records.load_spec(path)
        self.plan = SweepPlan.from_json(spec["plan"])
        self.cfg: dict[str, Any] = dict(spec.get("cfg") or {})
        self.k = int(spec.get("max_parallel") or len(self.plan) or 1)
        self.sched = get_scheduler(spec["scheduler"], spec.get("session", "default"))
        self.state = load_state(path, len(self.plan)) or initial_state(len(self.plan))
        self.trials: list[dict[str, Any]] = self.state["trials"]
        self.next = 0  # the first trial that may still need starting

    def running(self) -> list[int]:
        return [i for i, t in enumerate(self.trials) if unsettled(t) and t["app_id"]]

    def poll(self) -> bool:
        changed = False
        for i in self.running():
            t = self.trials[i]
            try:
                resp = self.sched.wait(t["app_id"], 0.0)
            except Exception as e:  # noqa: BLE001 - e.g. the engine did not answer: ask again
                _log(f"trial {i}: status of {t['app_id']} failed: {type(e).__name__}: {e}")
                continue
            changed |= record(t, resp, partial(records.first_end, self.path, i))
        return changed

    def skip_cancelled(self, cancelled: set[int]) -> bool:
        changed = False
        for i in cancelled:
            t = self.trials[i] if 0 <= i < len(self.trials) else None
            if t is not None and t["state"] in _LIVE and not t["app_id"]:
                t.update(state="CANCELLED", ended=time.time(), msg="cancelled by request")
                changed = True
        return changed

    def launch(self) -> bool:
        changed = False
        free = self.k - len(self.running())
        while free > 0 and self.next < len(self.trials):
            i, t = self.next, self.trials[self.next]
            self.next += 1
            if t["state"] != "PENDING" or t["app_id"]:
                continue
            self.start(i, t)
            changed = True
            free -= 1
        return changed

    def start(self, i: int, t: dict[str, Any]) -> None:
        t["started"] = time.time()
        try:
            # the workspace, if any, is in the images already (TrialsBackend.submit built it)
            t["app_id"] = self.sched.submit(trial_app(self.plan, i), self.cfg)
        except Exception as e:  # noqa: BLE001 - the trial fails, the sweep goes on
            t.update(state="FAILED", ended=time.time(), msg=f"submit failed: {e}")
            _log(f"trial {i}: submit failed: {type(e).__name__}: {e}")
            return
        t["state"] = "RUNNING"
        save_state(self.path, self.state)
        # A `cancel HANDLE/i` that came while it was being submitted saw no app to cancel.
        if i in records.cancel_requests(self.path)[1]:
            cancel_app(self.sched, t, partial(records.first_end, self.path, i))

    def run(self, wake_fd: int) -> None:
        save_state(self.path, self.state)
        while True:
            cancel_all, cancelled = records.cancel_requests(self.path)
            signums = _drain(wake_fd)
            if cancel_all or signal.SIGTERM in signums or signal.SIGINT in signums:
                records.request_cancel(self.path, None)
                cancel_everything(self.path, self.sched, self.state)
                return
            changed = self.poll()
            changed |= self.skip_cancelled(cancelled)
            changed |= self.launch()
            if changed:
                save_state(self.path, self.state)
            if not any(unsettled(t) for t in self.trials):
                return
            select.select([wake_fd], [], [], POLL_S)


def _drain(fd: int) -> list[int]:
    try:
        return list(os.read(fd, 4096))
    except BlockingIOError:
        return []


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m xrun.sweeps.supervisor SWEEP_DIR", file=sys.stderr)
        return 2
    # Signals first: a cancel that comes early must not be lost.
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda *_: None)  # the wake-up byte is what matters
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    records.write_json(
        os.path.join(argv[0], SUPERVISOR_FILE),
        {"pid": os.getpid(), "start": proc_start_time(os.getpid())},
    )
    sup = TrialsSupervisor(argv[0])
    try:
        sup.run(rfd)
    finally:
        sup.sched.close()
    _log(f"sweep ended: {sum(t['state'] == 'SUCCEEDED' for t in sup.trials)} trial(s) succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
