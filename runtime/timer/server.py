"""The server side of torch's ``FileTimerClient``: workers arm countdown timers through a FIFO,
and the agent kills a worker whose timer runs out (issue #24, item 5).

The protocol, as torch 2.13's ``torch.distributed.elastic.timer.file_based_local_timer`` speaks
it: the agent creates a FIFO at ``$TORCHELASTIC_TIMER_FILE`` (a fresh path in the temp dir when
unset) and gives its path to the workers in that variable. A client opens the FIFO for writing,
writes one JSON line of at most ``PIPE_BUF`` bytes and closes it::

    {"version": 1, "pid": 4242, "scope_id": "train.py#57", "expiration_time": 1764070000.5,
     "signal": 9}

``expiration_time`` is epoch seconds (a negative one releases the timer ``(pid, scope_id)``);
``signal`` is what the process gets when the time is up (0 or less: expire without a kill).
``expires(after=…)`` is acquire + release around a block.

Where xrun differs from torch's server, on purpose:

* it waits in ``select`` on the FIFO (a writer end stays open in the agent, so the FIFO reads
  as empty rather than at end-of-file) with the next expiry as the timeout: no 0.1 s polling;
* it kills only the agent's own workers and their process groups: the FIFO (mode 0600) names
  a pid, and torch's server would signal any pid it may, the agent's own included;
* after the kill, torch's server SIGKILLs its own process, the agent, so torchrun dies without
  a word and its peers find out by a timeout. xrun's agent goes on: the worker's death is a
  failure like any other (restart, or the summary), and the report says which timer expired.

Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from xrun import procs
from xrun.errors import UsageError

from ..throttle import Throttle

__all__ = ["ENABLE_ENV", "FILE_ENV", "Expired", "FileTimerServer", "serve"]

ENABLE_ENV = "TORCHELASTIC_ENABLE_FILE_TIMER"
FILE_ENV = "TORCHELASTIC_TIMER_FILE"


@dataclass(frozen=True)
class Expired:
    """A timer that ran out and the signal the worker got for it."""

    pid: int
    scope: str
    expiration_time: float
    signum: int
    killed_at: float

    def text(self) -> str:
        """``killed by the file timer: scope 'train.py#57' ran out 0.1 s ago (SIGKILL)``."""
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        late = max(0.0, self.killed_at - self.expiration_time)
        return (
            f"killed by the file timer: expires() of scope {self.where()!r} ran out "
            f"({late:.1f}s late when the agent sent {name})"
        )

    def where(self) -> str:
        """The scope, ``/job/train.py#57`` (torch's default: the caller) as ``train.py#57``."""
        path, sep, line = self.scope.rpartition("#")
        return f"{os.path.basename(path)}#{line}" if sep and line.isdigit() else self.scope


# The malformed requests' log lines (one timer server per agent), rate-limited.
_MALFORMED = Throttle("ignored {n} more malformed requests in the last {s} s")
_HAVE_PROC = os.path.isdir("/proc/self")  # without /proc no start time is ever known


def _log(msg: str) -> None:
    print(f"[xrun-agent {os.getpid()}] file timer: {msg}", file=sys.stderr, flush=True)


class FileTimerServer:
    """Serves the FIFO at ``path`` on a thread of its own until ``stop()``.

    ``watch(pids)`` names the workers it may kill (pid -> local rank); ``expired(pid)`` says
    whether (and why) it killed one."""

    def __init__(self, path: str, own_dir: bool = False) -> None:
        self.path = path
        self._own_dir = own_dir  # the FIFO's dir is ours to remove
        self._make_fifo()
        # Read end non-blocking; a write end of our own keeps the FIFO from reading as EOF
        # between clients, so select sleeps until a request or the next expiry.
        self._r = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._w = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._lock = threading.Lock()
        # -> (expiry, signal, the requester's start time): a timer is its requester's, not
        # its pid's (the next attempt's worker may take a dead worker's pid; see ``_request``)
        self._timers: dict[tuple[int, str], tuple[float, int, int | None]] = {}
        self._pids: dict[int, int] = {}  # the workers it may kill -> local rank
        # Their start times: a worker's timers outlive it (killed, it never released them) while
        # the agent waits for the next round, and its pid may go to any process meanwhile.
        self._starts: dict[int, int | None] = {}
        self._expired: dict[int, Expired] = {}
        # Requests served so far: a worker arming or clearing a timer is progress to the stall
        # watchdog (an int read without the lock: a torn read cannot happen in CPython).
        self.requests = 0
        self._buf = b""
        self._thread = threading.Thread(target=self._loop, name="xrun-file-timer", daemon=True)
        self._thread.start()

    def _make_fifo(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISFIFO(st.st_mode):  # never remove what is not a leftover FIFO
                raise UsageError(
                    f"{FILE_ENV}={self.path} exists and is not a FIFO: expected a path the "
                    "agent may create (a leftover FIFO is replaced); unset it for a fresh one"
                )
            self._refuse_if_read()
            os.unlink(self.path)
        try:
            os.mkfifo(self.path, 0o600)  # only the user's processes may ask for kills
        except OSError as e:
            raise UsageError(f"{FILE_ENV}={self.path}: cannot create the FIFO: {e}") from None

    def _refuse_if_read(self) -> None:
        """A FIFO that someone reads belongs to a live agent: replacing it would send that
        job's timer requests here, and its agent would kill its healthy workers when their
        armed timers ran out (P13). A non-blocking open for writing tells: ENXIO, no reader
        (a leftover); success, a reader."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # ENXIO: a leftover (any other error shows again in mkfifo's)
        os.close(fd)
        raise UsageError(
            f"{FILE_ENV}={self.path} is in use by another agent (a process reads that FIFO); "
            f"unset {FILE_ENV} for a private one"
        )

    # -- the agent's side ----------------------------------------------------------------------

    def watch(self, pids: Mapping[int, int]) -> None:
        """The current workers (local rank -> pid); timers of the previous ones are dropped."""
        with self._lock:
            self._pids = {pid: rank for rank, pid in pids.items()}
            self._starts = {pid: procs.proc_start_time(pid) for pid in self._pids}
            self._expired.clear()
            self._timers = {k: v for k, v in self._timers.items() if self._ours(k[0])}

    def expired(self, pid: int) -> Expired | None:
        with self._lock:
            return self._expired.get(pid)

    def stop(self) -> None:
        """End the thread, close the FIFO and remove it."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(5)
        for fd in (self._r, self._w, self._wake_r, self._wake_w):
            os.close(fd)
        try:
            os.unlink(self.path)
            if self._own_dir:
                os.rmdir(os.path.dirname(self.path))
        except OSError:
            pass

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                nxt = min((t[0] for t in self._timers.values()), default=None)
            timeout = None if nxt is None else max(0.0, nxt - time.time())
            ready, _, _ = select.select([self._r, self._wake_r], [], [], timeout)
            if self._wake_r in ready:
                return
            if self._r in ready:
                self._read()
            self._expire(time.time())

    def _read(self) -> None:
        try:
            data = os.read(self._r, 1 << 16)
        except BlockingIOError:
            return
        # A client writes one line per open (atomic up to PIPE_BUF); keep a partial tail.
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()[-4096:]
        for line in lines:
            if line.strip():
                self._request(line)

    def _request(self, line: bytes) -> None:
        try:
            req = json.loads(line)
            pid, scope = int(req["pid"]), str(req["scope_id"])
            expiry, sig = float(req["expiration_time"]), int(req.get("signal", 0))
        except (ValueError, KeyError, TypeError) as e:
            # A buggy worker may send thousands: the first few, then a count (throttle.py).
            said = _MALFORMED.line(
                f"ignored a malformed request ({type(e).__name__}: {line[:200]!r})"
            )
            if said is not None:
                _log(said)
            return
        start = procs.proc_start_time(pid) if expiry >= 0 else None
        with self._lock:
            self.requests += 1
            if expiry < 0:
                self._timers.pop((pid, scope), None)
            elif start is not None or not _HAVE_PROC:
                # Who asked: a dead worker never releases its timers, and the next attempt's
                # worker may get its pid; watch() then names that pid again, and the old timer
                # would kill the new worker. (A requester already gone has nothing to time.)
                self._timers[(pid, scope)] = (expiry, sig, start)

    def _expire(self, now: float) -> None:
        with self._lock:
            due: MutableMapping[tuple[int, int | None], list[tuple[float, str, int]]] = {}
            for (pid, scope), (expiry, sig, start) in self._timers.items():
                if expiry <= now:
                    due.setdefault((pid, start), []).append((expiry, scope, sig))
            for (pid, start), timers in due.items():
                # every timer of a reaped process goes, as in torch
                self._timers = {
                    k: v for k, v in self._timers.items() if (k[0], v[2]) != (pid, start)
                }
                self._reap(pid, start, sorted(timers), now)

    def _reap(
        self, pid: int, start: int | None, timers: list[tuple[float, str, int]], now: float
    ) -> None:
        """Kill ``pid`` (while it is the process started at ``start`` that asked) with the
        signal of its earliest expired timer that has one (the lock held)."""
        armed = [(expiry, scope, sig) for expiry, scope, sig in timers if sig > 0]
        scopes = ", ".join(scope for _, scope, _ in timers)
        if not armed:
            _log(f"expired without a signal, not killed: pid {pid} ({scopes})")
            return
        if not self._ours(pid):
            _log(f"expired for pid {pid}, which is no worker of this agent: not killed")
            return
        expiry, scope, sig = armed[0]
        try:
            # Through a pidfd: never a process that took the requester's pid (another worker's
            # included), nor one in a worker's group that took a dead member's pid.
            if not procs.signal_if_same(pid, start, sig):
                return  # it ended meanwhile (and its pid may be another process's now)
        except ProcessLookupError:
            return  # it ended on its own meanwhile
        except OSError as e:
            _log(f"could not signal pid {pid}: {e}")
            return
        self._expired[pid] = Expired(pid, scope, expiry, sig, now)
        rank = self._pids.get(pid)
        who = f"local rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"
        _log(f"{who}: {self._expired[pid].text()}")

    def _ours(self, pid: int) -> bool:
        """A worker, or a process in a worker's process group (each worker leads its own)."""
        if pid in self._pids:
            return True
        try:
            leader = os.getpgid(pid)
        except OSError:
            return False
        return leader in self._pids and procs.is_alive(leader, self._starts.get(leader))


def serve(
    server: FileTimerServer | None, envs: Mapping[int, MutableMapping[str, str]], run_id: str
) -> FileTimerServer | None:
    """The agent's timer server for the next worker group (``server``: the one it has), or None
    when ``$TORCHELASTIC_ENABLE_FILE_TIMER`` is not ``1``; every worker's env gets
    ``TORCHELASTIC_TIMER_FILE``, as torch's agent gives it."""
    if os.environ.get(ENABLE_ENV) != "1":
        return None
    if server is None:
        path = os.environ.get(FILE_ENV)
        if path:
            server = FileTimerServer(path)
        else:  # in a fresh 0700 dir: no name in /tmp another user could have taken first
            tmp = tempfile.mkdtemp(prefix=f"xrun-timer-{run_id[:8]}-")
            server = FileTimerServer(os.path.join(tmp, "watchdog_timer"), own_dir=True)
    for env in envs.values():
        env[FILE_ENV] = server.path
    return server
