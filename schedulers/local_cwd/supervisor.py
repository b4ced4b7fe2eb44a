"""The detached supervisor of one local_cwd app: spawns its replicas, waits, records their fate.

``local_cwd`` starts one supervisor per app, in a new session, as::

    python -S [-P] .../xrun/schedulers/local_cwd/supervisor.py STATE_DIR [--ready-fd FD]

so the app outlives the ``xrun run`` that launched it (a SIGKILLed CLI leaves the job running)
and any process can ask about it: everything the supervisor knows is in ``STATE_DIR/state.json``,
rewritten atomically (temp file + rename) after every change.

What it does, in order:

1. reads ``STATE_DIR/request.json`` (written by :mod:`xrun.schedulers.local_cwd.launch`);
2. starts every replica in its own process group (``start_new_session``) so a stop reaches the
   replica's children too (the runtime agent and its workers);
3. sleeps in ``select`` on a self-pipe that SIGCHLD/SIGTERM/SIGINT write to: no polling;
4. gang semantics: the first replica to exit non-zero fails the app and its siblings get SIGTERM
   to their process groups, ``grace_s`` seconds, then SIGKILL. A replica that ends non-zero on
   its own is FAILED; only one that ends by the supervisor's SIGTERM/SIGKILL is CANCELLED. Which
   replica the app's message names is read from the runtime agents' exit records
   (``$XRUN_EXIT_RECORD``): a replica whose agent says a peer's failure ended it ("closed by a
   peer") is not the root cause, the one whose own workers failed first is. The first to exit
   is often not that one (the failing node's agent still writes its summary and reads the
   survivors' stacks), so after a runtime agent's failure (it left an exit record: its failure
   closed the job for its peers, which end by themselves) the others get ``grace_s`` to end on
   their own before the SIGTERM; any other replica's failure stops them at once. An elastic role
   (``min_replicas < num_replicas``) may lose replicas down to ``max(min_replicas, 1)``
   before that happens: its runtime agents carry on with fewer nodes. SIGTERM/SIGINT to the supervisor
   (what ``cancel`` sends) stops every replica the same way and the app ends CANCELLED;
5. writes the final state only after every replica has been reaped, then exits. So "the state
   file says terminal" implies "all output is in the log files" (log followers rely on it).

When a write of ``state.json`` fails (a full disk: ENOSPC), the temp file is removed, the error
goes to ``supervisor.log`` and into the state (``disk_error``, which ``status`` shows), and the
supervisor carries on: a small reserve file made at start is given up first, so that the
record of the failure itself has room. A supervisor that fails in any other way stops the
replicas it started and records the app FAILED with the cause, so no app stays SUBMITTED or
RUNNING for ever behind a dead supervisor.

Standard library only, and from xrun only :mod:`xrun.procs` (itself stdlib only): it runs with
``-S`` (no site-packages scan) to start ~15 ms sooner, which is on every local job's critical
path. It is exec'd by its file's path, not with ``-m``, so not even this package's ``__init__``
runs. The rest of ``local_cwd`` imports the small helpers below (``write_json_atomic``,
``grace_of``) from here.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

if not __package__:  # exec'd by its path with -S -P (launch.py): xrun is not on sys.path
    # This file is <root>/xrun/schedulers/local_cwd/supervisor.py in any install; appended, so
    # no stdlib name is shadowed.
    _here = os.path.abspath(__file__)
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_here)))))

from xrun.procs import proc_start_time  # noqa: E402 - the path above first

if TYPE_CHECKING:
    import subprocess

STATE_FILE = "state.json"
REQUEST_FILE = "request.json"
LOG_FILE = "supervisor.log"
# Disk space kept back for the record of a full disk (see the module doc).
RESERVE_FILE = "reserve"
RESERVE_BYTES = 64 * 1024
# The longest grace period a request may carry (xrun.contract.MAX_DURATION_S: this file imports
# nothing from xrun); the run option is checked at submit, this guards a hand-edited request.
MAX_GRACE_S = 86_400.0

RUNNING, SUCCEEDED, FAILED, CANCELLED = "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
# How a replica the supervisor stopped ends: killed by its SIGTERM/SIGKILL, or (a runtime agent,
# a shell) exiting 128+N after it.
_STOPPED_CODES = frozenset(
    {-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL}
)
# xrun.contract.EXIT_RECORD_ENV (this file imports nothing from xrun)
EXIT_RECORD_ENV = "XRUN_EXIT_RECORD"


# --------------------------------------------------------------------------- shared helpers
def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON so readers see the old or the new file, never half of one. On a
    failure (ENOSPC...) the temp file is removed before the error propagates."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def grace_of(request: dict[str, Any]) -> float:
    """The request's grace period in seconds, 0..MAX_GRACE_S (NaN: the default, 10)."""
    try:
        grace = float(request.get("grace_s", 10.0))
    except (TypeError, ValueError):
        grace = 10.0
    return 10.0 if grace != grace else min(max(grace, 0.0), MAX_GRACE_S)


# --------------------------------------------------------------------------- the supervisor
class Supervisor:
    def __init__(self, state_dir: str, wake_fd: int, ready_fd: int | None = None) -> None:
        self.state_dir = state_dir
        self.wake_fd = wake_fd
        self.ready_fd = ready_fd
        self.cancel_requested = False
        self.kill_deadline: float | None = None  # set while stopping replicas: SIGKILL then
        # set after a replica ended by a peer's failure: SIGTERM the rest then (see the doc)
        self.term_deadline: float | None = None
        # how surely the replica the app's message names holds the root cause (lower: surer),
        # once a replica's failure failed the app (not a cancel, not a crash of ours)
        self.blame: tuple[int, float] | None = None
        self.blamable = False
        with open(os.path.join(state_dir, REQUEST_FILE)) as f:
            self.request: dict[str, Any] = json.load(f)
        self.grace_s = grace_of(self.request)
        # Gang semantics, relaxed for elastic roles: a role may lose this many replicas
        # (num_replicas - max(min_replicas, 1)) before the app fails.
        self.tolerate: dict[str, int] = dict(self.request.get("tolerate", {}))
        self.failures: dict[str, int] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # replica index -> process
        self.replicas: list[dict[str, Any]] = [
            {
                "role": r["role"],
                "id": r["id"],
                "pid": None,
                "start": None,
                "exit_code": None,
                "state": "PENDING",
                "msg": "",
            }
            for r in self.request["replicas"]
        ]
        self.state: dict[str, Any] = {
            "app_id": self.request["app_id"],
            "state": RUNNING,
            "msg": "",
            "supervisor": {"pid": os.getpid(), "start": proc_start_time(os.getpid())},
            "started_at": time.time(),
            "ended_at": None,
            "replicas": self.replicas,
        }

    # ---- state
    def reserve_space(self) -> None:
        """Keep :data:`RESERVE_BYTES` of the disk for the record of a full disk."""
        try:
            fd = os.open(
                os.path.join(self.state_dir, RESERVE_FILE), os.O_WRONLY | os.O_CREAT, 0o600
            )
            try:
                os.write(fd, bytes(RESERVE_BYTES))
            finally:
                os.close(fd)
        except OSError:  # already full: nothing to keep back
            pass

    def save(self) -> None:
        """Write state.json; a failed write is logged and recorded, never fatal."""
        path = os.path.join(self.state_dir, STATE_FILE)
        try:
            write_json_atomic(path, self.state)
            return
        except OSError as e:
            error = f"{e.strerror or e} writing {path}"
        first = self.state.get("disk_error") is None
        self.state["disk_error"] = f"{error} at {time.strftime('%H:%M:%S')}"
        try:  # the reserve's space is for this record (and the log line)
            os.unlink(os.path.join(self.state_dir, RESERVE_FILE))
        except OSError:
            pass
        if first:
            _log(f"error: {error}; the app goes on, its recorded state may lag behind")
        try:
            write_json_atomic(path, self.state)
        except OSError:
            pass  # still no room: status reads the disk's state itself (statvfs)

    # ---- spawning
    def spawn_all(self) -> None:
        env_base = dict(os.environ)
        for i, spec in enumerate(self.request["replicas"]):
            if self.cancel_requested or self.state["state"] != RUNNING:
                self.replicas[i]["state"] = CANCELLED
                continue
            self._spawn(i, spec, env_base)

    def _spawn(self, i: int, spec: dict[str, Any], env_base: dict[str, str]) -> None:
        rep = self.replicas[i]
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        out = os.open(spec["stdout"], flags, 0o600)
        err = os.open(spec["stderr"], flags, 0o600)
        # benchmark 5: the rest of local_cwd imports this module's helpers, and a dry run
        # must not pay for subprocess (threading, selectors, locale) to start nothing
        import subprocess

        try:
            proc = subprocess.Popen(
                spec["argv"],
                cwd=self.request["cwd"],
                env={**env_base, **spec["env"]},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # own process group: a stop reaches its children
            )
        except OSError as e:
            # e.g. the entrypoint vanished since the dry run: the shell's "cannot execute" code
            msg = f"cannot start {spec['argv'][0]!r}: {e.strerror or e}"
            os.write(err, (msg + "\n").encode())
            rep.update(state=FAILED, exit_code=127, msg=msg)
            self.fail(f"replica {rep['role']}/{rep['id']} failed: {msg}")
            if self.blame is None and self.blamable:  # its own failure, the surest kind
                self.blame = (0, time.time())
                self.state["culprit"] = i
            return
        finally:
            os.close(out)
            os.close(err)
        self.procs[i] = proc
        rep.update(pid=proc.pid, start=proc_start_time(proc.pid), state=RUNNING)

    # ---- reaping
    def reap(self) -> bool:
        """Collect every exited replica; True when something changed."""
        changed = False
        for i, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.procs[i]
            changed = True
            rep = self.replicas[i]
            rep["exit_code"] = code
            stopped = rep["state"] == "STOPPING"  # we sent it SIGTERM (a cancel, a gang stop)
            if code == 0:
                rep["state"] = SUCCEEDED
            elif stopped and (self.cancel_requested or code in _STOPPED_CODES):
                rep["state"] = CANCELLED
            elif stopped:  # it ended non-zero by itself while being stopped: its own failure
                rep["state"] = FAILED
                self._blame(i, code, self._exit_record(i))
            else:
                rep["state"] = FAILED
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                msg = f"replica {rep['role']}/{rep['id']} {how}"
                role = rep["role"]
                self.failures[role] = self.failures.get(role, 0) + 1
                if self.failures[role] > self.tolerate.get(role, 0):
                    record = self._exit_record(i)
                    self.fail(msg, defer=bool(record))
                    self._blame(i, code, record)
                else:  # an elastic role above its minimum: the survivors carry on
                    rep["msg"] = msg
                    _log(f"{msg}; role {role} goes on with fewer replicas")
        return changed

    def _exit_record(self, i: int) -> dict[str, Any]:
        """Replica ``i``'s runtime agent's exit record; {} when it left none (not an agent)."""
        path = self.request["replicas"][i].get("env", {}).get(EXIT_RECORD_ENV)
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, TypeError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _blame(self, i: int, code: int, record: dict[str, Any]) -> None:
        """Name replica ``i`` in the app's message when its failure is surer the root cause
        than the one named: its own workers failed (earliest first) before one without an
        exit record, before one a peer's failure ended."""
        if self.cancel_requested or not self.blamable:
            return
        by_peer = record.get("by_peer")
        when = record.get("failed_at", record.get("ended_at"))
        when = float(when) if isinstance(when, (int, float)) else time.time()
        key = (2 if by_peer is True else 0 if by_peer is False else 1, when)
        if self.blame is not None and key >= self.blame:
            return
        rep = self.replicas[i]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        self.blame = key
        self.state.update(msg=f"replica {rep['role']}/{rep['id']} {how}", culprit=i)

    def fail(self, msg: str, defer: bool = False) -> None:
        """Gang semantics: the first failure decides the app's fate and stops the others; with
        ``defer`` (a runtime agent's failure) they first get the grace period to end on their
        own, and to say which of them failed first."""
        if self.state["state"] == RUNNING:
            self.state.update(state=FAILED, msg=msg)
            self.blamable = True
            if defer and self.procs:
                self.term_deadline = time.monotonic() + self.grace_s
            else:
                self.stop_all()

    def stop_all(self) -> None:
        """SIGTERM every live replica's process group; SIGKILL follows after the grace period."""
        self.term_deadline = None
        self.kill_deadline = time.monotonic() + self.grace_s
        for i, proc in self.procs.items():
            self.replicas[i]["state"] = "STOPPING"
            _killpg(proc.pid, signal.SIGTERM)

    # ---- main loop
    def drain_wakeups(self) -> list[int]:
        try:
            return list(os.read(self.wake_fd, 4096))
        except BlockingIOError:
            return []

    def run(self) -> str:
        self.handle_signals(self.drain_wakeups())
        self.reserve_space()
        self.spawn_all()
        self.reap()
        self.save()
        if self.ready_fd is not None:
            _tell_ready(self.ready_fd)
        while self.procs:
            timeout = None
            deadline = self.kill_deadline if self.kill_deadline is not None else self.term_deadline
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.wake_fd], [], [], timeout)
            if ready:
                self.handle_signals(self.drain_wakeups())
            elif self.kill_deadline is not None:  # grace period over
                for proc in self.procs.values():
                    _killpg(proc.pid, signal.SIGKILL)
                self.kill_deadline = None
            elif self.term_deadline is not None:  # they did not end on their own
                self.stop_all()
            if self.reap():
                self.save()
        # Leftovers in a replica's group (children that outlived it) do not survive the app.
        for rep in self.replicas:
            if rep["pid"]:
                _killpg(rep["pid"], signal.SIGKILL)
        if self.state["state"] == RUNNING:
            self.state["state"] = SUCCEEDED
        self.state["ended_at"] = time.time()
        self.save()
        try:
            os.unlink(os.path.join(self.state_dir, RESERVE_FILE))
        except OSError:
            pass
        return str(self.state["state"])

    def crashed(self, cause: str) -> None:
        """This supervisor failed (a bug, a request it cannot run): stop every replica it
        started (SIGTERM, grace, SIGKILL) and record the app FAILED with ``cause``."""
        self.kill_deadline = self.term_deadline = None
        self.blamable = False
        self.state.pop("culprit", None)
        for proc in self.procs.values():
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + min(self.grace_s, 30.0)
        while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in self.procs.values():
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for i, proc in self.procs.items():
            self.replicas[i].update(exit_code=proc.returncode, state=CANCELLED)
        for rep in self.replicas:
            if rep["state"] == "PENDING":  # never started
                rep["state"] = CANCELLED
        self.procs.clear()
        self.state.update(state=FAILED, msg=cause, ended_at=time.time())
        self.save()

    def handle_signals(self, signums: list[int]) -> None:
        if (signal.SIGTERM in signums or signal.SIGINT in signums) and not self.cancel_requested:
            self.cancel_requested = True
            if self.state["state"] == RUNNING:
                self.state.update(state=CANCELLED, msg="cancelled by request")
                self.stop_all()
            elif self.term_deadline is not None:  # failed, waiting for the rest: stop them now
                self.stop_all()


def _log(msg: str) -> None:
    """A line in supervisor.log (fd 2). Not print(): a forked supervisor's sys.stderr is still
    the launcher's Python object, possibly wrapping an fd that serve_forked closed."""
    try:
        os.write(2, f"{time.strftime('%H:%M:%S')} {msg}\n".encode())
    except OSError:
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tell_ready(fd: int) -> None:
    """Tell the launching ``schedule()`` that the replicas run and state.json exists."""
    try:
        os.write(fd, b"ok\n")
        os.close(fd)
    except OSError:  # the launcher is gone (SIGKILLed CLI): nobody to tell
        pass


def serve_forked(state_dir: str, ready_fd: int, log_path: str) -> None:
    """Become the supervisor in a child just forked from ``schedule()``; never returns.

    Forking skips a new interpreter's start-up (tens of ms on every local job). The child
    leaves the launcher's session and drops every inherited fd (a CLI's stdout pipe, sockets),
    so to the rest of the system it looks just like the exec'd supervisor.
    """
    code = 1
    try:
        os.setsid()
        try:  # `ps -o comm`/top show this name instead of the launcher's (a copy until here)
            with open("/proc/self/comm", "w") as f:
                f.write("xrun-supervisor")
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, ready_fd)
        os.closerange(ready_fd + 1, 1 << 16)
        code = main([state_dir, "--ready-fd", str(ready_fd)])
    except BaseException:
        import traceback

        os.write(2, traceback.format_exc().encode())
    finally:
        os._exit(code)  # never run the launcher's cleanup (atexit, buffered output) twice


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--ready-fd"):
        print("usage: supervisor.py STATE_DIR [--ready-fd FD]", file=sys.stderr)
        return 2
    # Signals first, before anything slow: a cancel that arrives early must not be lost.
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wake-up byte is what matters
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sup: Supervisor | None = None
    try:
        sup = Supervisor(argv[0], rfd, int(argv[2]) if len(argv) == 3 else None)
        final = sup.run()
    except Exception as e:
        import traceback

        _log(traceback.format_exc().rstrip())
        cause = f"the supervisor failed: {type(e).__name__}: {e}"
        if sup is not None:
            sup.crashed(f"{cause} (its log: {os.path.join(argv[0], LOG_FILE)})")
        else:
            _record_failure(argv[0], cause)
        return 1
    return {SUCCEEDED: 0, FAILED: 1, CANCELLED: 3}.get(final, 1)


def _record_failure(state_dir: str, cause: str) -> None:
    """state.json for a supervisor that failed before it knew the replicas (an unreadable
    request): FAILED with the cause, so status says so instead of SUBMITTED for ever."""
    log = os.path.join(state_dir, LOG_FILE)
    state = {
        "app_id": os.path.basename(os.path.dirname(os.path.abspath(state_dir))),
        "state": FAILED,
        "msg": f"{cause} (its log: {log})",
        "supervisor": {"pid": os.getpid(), "start": proc_start_time(os.getpid())},
        "started_at": time.time(),
        "ended_at": time.time(),
        "replicas": [],
    }
    try:
        write_json_atomic(os.path.join(state_dir, STATE_FILE), state)
    except OSError as e:
        _log(f"error: cannot record the failure: {e}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
