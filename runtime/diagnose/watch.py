"""The agent's diagnostic hooks: answering ``xrun stacks``, the stall watchdog, and the
survivors' stacks a failure report shows.

* **Stacks on demand.** A byte written to the FIFO ``<log_dir>/<run_id>/stacks.request``
  (``STACKS_REQUEST_FIFO``, 0600, made when the first worker group starts) asks for the workers'
  stacks: the agent's select loop wakes on it, collects them and writes
  ``<log_dir>/<run_id>/stacks.json`` (``STACKS_FILE``), which the CLI gathers through the
  scheduler. No signal: a signal can end a job (SIGUSR1 is a Slurm job's pre-emption notice
  in ``--signals-to-handle``; any signal kills an agent before its handler is in place or
  after it is gone), while a write to a FIFO nobody reads fails (ENXIO) and ends nothing.
* **Stall watchdog** (``--stall-timeout S``, off by default). A *sign of life* is a worker's
  log file growing (or the agent's own stdout/stderr when those are files), a write by a worker
  (``/proc/PID/io`` ``wchar``: a line to a pipe, a terminal or docker's log driver, a
  checkpoint), its beat file touched (``beat.beat()``) or a request to the agent's file timer
  (torch's ``FileTimerClient``). *Work* is a sign of life, or a worker's process tree using
  CPU, reading, or staying runnable (``activity``). The attempt has stalled when, after the
  first sign of life, no worker worked for ``S`` seconds (a rank blocked in a collective or
  asleep uses no CPU), or when no sign of life came for the silent limit ``L``
  (``--stall-silent-timeout``, default ``max(10 S, 600 s)``): a silent start-up (imports, a
  data load), a silent busy phase. Work that is only ranks spinning in a wait that never ends
  (CUDA's busy wait behind a hung NCCL collective) is no work after ``S`` s (``spin``: stacks
  read only in that state). Workers found in
  interpreter shutdown are not stalled: their teardown has the silent limit only. The agent
  looks every ``S/4`` seconds (at most 1 s): a few ``stat`` and ``/proc`` reads per worker,
  nothing when off. On several nodes the agents share signs of life and work through a counter
  in the rendezvous store, so a node whose workers print nothing does not stall while another
  node's do; a thread makes that exchange, never the loop (``shared``: a slow store holds up
  nothing, and while this agent's view of the others is stale it declares no stall). On a
  stall the local ranks' stacks, grouped, become the attempt's root cause.
* **Survivors.** When a rank fails, the still-running ranks' stacks are read (bounded: at most
  3 s and half of ``--shutdown-timeout``) before they are stopped, for the failure report.

Standard library only; ``stacks``/``groups`` (and ``json``) load when stacks are collected.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from xrun.contract import BEAT_FILE_ENV, STACKS_FILE, STACKS_REQUEST_FIFO

from ..events import Stalled
from ..rendezvous import RendezvousError
from .activity import WINDOW_S, Activity
from .shared import SharedProgress
from .spin import Spin

if TYPE_CHECKING:
    from ..rendezvous.api import RendezvousInfo
    from ..rendezvous.kv import KeyValue
    from ..workers.api import PContext

__all__ = ["Diagnostics"]

# A stack request's own bound: a py-spy that hangs must not hold the agent's loop long.
_REQUEST_TIMEOUT_S = 5.0
_SURVIVORS_MAX_S = 3.0
# How old the view of the other nodes' progress may be (shared.py) before a check declares no
# stall, in check periods and at least in seconds: a healthy store answers in milliseconds.
_FRESH_PERIODS, _FRESH_MIN_S = 3, 2.0
_SILENT_MIN_S = 600.0  # the silent limit's floor when --stall-silent-timeout is 0
# How long a stalled agent waits for the other nodes' stacks: they find the same stall within
# one check period (the shared progress counter) plus their own py-spy time.
_SHARE_WAIT_S = 5.0


def _alive(pid: int) -> bool:
    """Running (not exited, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _is_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


class Diagnostics:
    """One agent's hooks. ``attach`` each new worker group; ``check`` on every wake-up of the
    watch loop (a stack request to answer, a stall to report)."""

    def __init__(
        self, stall_timeout: float, shutdown_timeout: float, host: str, silent_timeout: float = 0
    ) -> None:
        self.stall_timeout = stall_timeout
        # never shorter than the stall timeout itself
        self.silent_timeout = max(
            silent_timeout or max(10 * stall_timeout, _SILENT_MIN_S), stall_timeout
        )
        self._shutdown_timeout = shutdown_timeout
        self._host = host
        self._period = min(1.0, stall_timeout / 4) if stall_timeout > 0 else 0.0
        self.request_fd = -1  # the stack-request FIFO's, open for reading (see attach)
        self._request_dir = ""  # where the FIFO and the answer are (the run dir)
        self._pc: PContext | None = None
        self._offset = 0
        self._run_dir = ""
        self._kv: Callable[[], KeyValue] | None = None
        self._beats: Callable[[], int] | None = None
        self._files: list[str] = []
        self._fds: list[int] = []
        self._seen: tuple[Any, ...] = ()
        self._shared: SharedProgress | None = None  # several nodes: the progress exchange
        self._activity = Activity()
        self._spin = Spin(stall_timeout, self._period)
        self._remote_worked = 0.0  # monotonic time another node's workers last worked
        self._said = 0.0  # monotonic time of the last sign of life
        self._worked = 0.0  # … of the last work (a sign of life is work too)
        self._started = False  # a sign of life came in this attempt
        self._exiting = False  # the stall check found every worker in interpreter shutdown
        self._next_poll = 0.0
        self._survivors = ""
        self._round = self._node = 0
        self._nodes = 1

    # -- set-up ---------------------------------------------------------------------------------

    def install(self) -> Callable[[], None]:
        """Returns the undo function: closes and removes the stack-request FIFO (made by
        ``attach``) when the agent is done."""

        def close() -> None:
            self._share(None)
            if self.request_fd >= 0:
                os.close(self.request_fd)
                self.request_fd = -1
                try:
                    os.unlink(os.path.join(self._request_dir, STACKS_REQUEST_FIFO))
                except OSError:
                    pass

        return close

    def _open_requests(self, run_dir: str) -> None:
        """Make the stack-request FIFO in ``run_dir`` and hold it open for reading and writing:
        O_RDWR, so that it never reads as closed (EOF) between writers and a writer's open
        succeeds exactly while this agent lives (the CLI finds it in ``/proc/PID/fd``)."""
        path = os.path.join(run_dir, STACKS_REQUEST_FIFO)
        try:
            os.mkfifo(path, 0o600)
            self.request_fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:  # a file system without FIFOs: no stacks on demand, nothing else
            print(
                f"xrun-agent: `xrun stacks` cannot ask this agent: {path}: {e.strerror or e}",
                file=sys.stderr,
                flush=True,
            )
            return
        self._request_dir = run_dir

    def _requested(self) -> bool:
        """Whether a stack request came in (its bytes are read: one answer for any number)."""
        if self.request_fd < 0:
            return False
        got = False
        try:
            while os.read(self.request_fd, 512):
                got = True
        except BlockingIOError:
            pass
        return got

    def worker_env(self, error_file: str) -> dict[str, str]:
        """The beat file of the worker whose error file is ``error_file`` (stall watchdog on)."""
        if self.stall_timeout <= 0 or not error_file:
            return {}
        return {BEAT_FILE_ENV: os.path.join(os.path.dirname(error_file), "beat")}

    def attach(
        self,
        pc: PContext,
        info: RendezvousInfo,
        run_dir: str,
        kv: Callable[[], KeyValue] | None = None,
        beats: Callable[[], int] | None = None,
    ) -> None:
        """A new worker group started (``kv``: the store's keys, for a job of several nodes;
        ``beats``: a count that grows with the workers' progress, the file timer's requests)."""
        self._pc, self._offset, self._run_dir, self._kv = pc, info.rank_offset, run_dir, kv
        self._beats = beats
        self._round, self._node, self._nodes = info.round, info.group_rank, info.group_world_size
        self._survivors = ""
        pc.before_stop = self._read_survivors
        if run_dir and self.request_fd < 0:
            self._open_requests(run_dir)
        if self.stall_timeout > 0:
            self._files = [
                p
                for lr in range(pc.nprocs)
                for p in (
                    pc.stdouts.get(lr, ""),
                    pc.stderrs.get(lr, ""),
                    self.worker_env(pc.error_files.get(lr, "")).get(BEAT_FILE_ENV, ""),
                )
                if p
            ]
            # Workers without log files write to the agent's own stdout/stderr: where those are
            # files (a scheduler's replica log), their growth is progress too.
            self._fds = [fd for fd in (1, 2) if _is_file(fd)]
            self._seen = self._signature()
            self._activity.reset()
            self._spin.reset()
            self._said = self._worked = self._remote_worked = time.monotonic()
            self._started = self._exiting = False
            self._next_poll = self._said + self._period
            self._share(kv if self._nodes > 1 else None)

    def _share(self, kv: Callable[[], KeyValue] | None) -> None:
        """The new group's progress exchange with the other nodes (None: no other node, or
        the agent is done); the last group's thread is let go without waiting for it."""
        if self._shared is not None:
            self._shared.close(timeout=0)
        self._shared = None
        if kv is not None:
            fresh_s = max(_FRESH_PERIODS * self._period, _FRESH_MIN_S)
            self._shared = SharedProgress(kv, fresh_s)

    def timeout(self, default: float | None) -> float | None:
        """The watch loop's select timeout: wake up for the stall checks when they are on."""
        if self._period <= 0:
            return default
        return self._period if default is None else min(default, self._period)

    # -- the loop's hook -------------------------------------------------------------------------

    def check(self) -> Stalled | None:
        """Answer a pending stack request; ``Stalled`` once nothing progressed for the timeout."""
        if self._requested():
            self.answer()
        if self._period <= 0 or self._pc is None:
            return None
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + self._period
        sig = self._signature()
        wrote, working = self._activity.look(self._pc.pids().values(), now)
        said = sig != self._seen or wrote
        self._seen = sig
        spun = self._spinning(now, said, working)
        # a node whose only work is ranks spinning in a wait tells the others it did none
        said_there, worked_there, fresh = self._shared_progress(
            now, said, said or (working and not spun)
        )
        if said or said_there:
            self._said = now
            self._started, self._exiting = True, False
            self._spin.reset()
        if worked_there:
            self._remote_worked = now
        if said or working or said_there or worked_there:
            self._worked = now
        if not fresh:
            return None  # the others' progress is unknown, not absent: judge when it is known
        if now - self._said >= self.silent_timeout:
            return self._stalled(silent=True)
        if not self._started or self._exiting:
            return None
        if (
            spun
            and now - self._said >= self.stall_timeout
            and now - self._remote_worked >= max(WINDOW_S, 2 * self._period)
        ):
            return self._stalled(silent=False, spinning=spun)
        if now - self._worked < self.stall_timeout:
            return None
        return self._stalled(silent=False)

    def _spinning(self, now: float, said: bool, working: bool) -> dict[int, int]:
        """The spin rule (``spin``): global rank -> % CPU of the local workers that spin in a
        wait, when they are this node's only work; {} otherwise. Stacks are read only after
        ``S/2`` s without a sign of life while the only work is CPU without I/O."""
        act = self._activity
        if (
            said
            or not working
            or not self._started
            or self._exiting
            or act.other_work
            or not act.spinners
            or now - self._said < self.stall_timeout / 2
        ):
            self._spin.reset()
            return {}
        suspects = {r: w for r, w in self._workers().items() if w[1] in act.spinners}
        self._spin.look(suspects, now)
        if len(suspects) != len(act.spinners) or not self._spin.confirmed(act.spinners):
            return {}
        return {r: act.spinners[pid] for r, (_, pid) in suspects.items()}

    def _signature(self) -> tuple[Any, ...]:
        out: list[Any] = [self._beats() if self._beats is not None else 0]
        for fd in self._fds:
            try:
                st = os.fstat(fd)
                out.append((st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        for p in self._files:
            try:
                st = os.stat(p)
                out.append((st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def _shared_progress(self, now: float, said: bool, worked: bool) -> tuple[bool, bool, bool]:
        """Several nodes: post ours to the exchange (shared.py; never blocks); whether another
        node's workers showed a sign of life, whether they worked, since the last check, and
        whether that view is fresh (always, on one node)."""
        if self._shared is None:
            return False, False, True
        self._shared.post(said, worked)
        return self._shared.take(now)

    def _stalled(self, silent: bool, spinning: Mapping[int, int] | None = None) -> Stalled | None:
        from .groups import format_groups, group, headline  # benchmark 1: a stall only

        ranks = self._collect(self._workers(), _REQUEST_TIMEOUT_S)
        for rank, pct in (spinning or {}).items():
            if rank in ranks:
                ranks[rank]["spinning"] = pct  # "waits in … at 100 % CPU (spinning)"
        if not silent and ranks and all(r.get("exiting") for r in ranks.values()):
            # Past their last line and tearing down (torch's finalizers, a gloo teardown): a
            # job that did its work is not killed for it; a teardown that hangs meets the
            # silent limit.
            self._exiting = True
            return None
        if self._kv is not None and self._nodes > 1:
            ranks = self._every_nodes(ranks)
        groups = group(ranks)
        if silent:
            what = f"{self.silent_timeout:g} s without a line, write, beat or timer request"
        else:
            what = f"{self.stall_timeout:g} s"
        reason = f"stalled {what}: {headline(groups)}"
        return Stalled(reason, format_groups(ranks, groups))

    def _every_nodes(self, ranks: dict[int, Any]) -> dict[int, Any]:
        """Every node's ranks: each stalled agent publishes its own in the store and reads the
        others' (bounded), so that every node's root cause names the odd rank wherever it is."""
        assert self._kv is not None
        prefix = f"diagnose/stall/{self._round}/"
        merged = dict(ranks)
        try:
            kv = self._kv()
            kv.set(f"{prefix}{self._node}", json.dumps(ranks).encode())
        except RendezvousError:
            return merged  # the store is gone: our own ranks only
        deadline = time.monotonic() + _SHARE_WAIT_S
        for node in range(self._nodes):
            if node == self._node:
                continue
            try:
                raw = kv.get(f"{prefix}{node}", max(0.1, deadline - time.monotonic()))
                merged.update({int(r): v for r, v in json.loads(raw).items()})
            except (RendezvousError, ValueError):
                continue  # a node that did not answer in time: its ranks are not in the report
        return dict(sorted(merged.items()))

    # -- collecting --------------------------------------------------------------------------------

    def _workers(self, skip: frozenset[int] = frozenset()) -> dict[int, tuple[int, int]]:
        if self._pc is None:
            return {}
        return {
            self._offset + lr: (lr, pid)
            for lr, pid in self._pc.pids().items()
            if lr not in skip and _alive(pid)
        }

    def _collect(self, workers: Mapping[int, tuple[int, int]], timeout: float) -> dict[int, Any]:
        from .stacks import collect  # benchmark 1: py-spy helpers, a stall or `xrun stacks` only

        # a worker found exiting: the last traceback in its stderr file says where it was
        files = self._pc.stderrs if self._pc is not None else {}
        stderrs = {r: files.get(lr, "") for r, (lr, _) in workers.items()}
        ranks = collect(workers, timeout, stderrs)
        for r in ranks.values():
            r["host"] = self._host
        return ranks

    def answer(self) -> None:
        """Write this node's stacks to ``<run dir>/stacks.json`` for ``xrun stacks``."""
        ranks = self._collect(self._workers(), _REQUEST_TIMEOUT_S)
        doc = {
            "host": self._host,
            "agent_pid": os.getpid(),
            "answered_at": time.time(),
            "ranks": {str(r): v for r, v in ranks.items()},
        }
        path = os.path.join(self._request_dir, STACKS_FILE)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(doc, f)
            os.replace(tmp, path)
        except OSError as e:
            print(f"xrun-agent: could not write {path}: {e}", file=sys.stderr, flush=True)

    def _read_survivors(self, failed_local_ranks: frozenset[int]) -> None:
        """The still-running ranks' grouped stacks, read when a rank failed and before the
        others are stopped (PContext.before_stop); nothing when none are left or there is no
        time for it."""
        budget = min(_SURVIVORS_MAX_S, self._shutdown_timeout / 2)
        workers = self._workers(failed_local_ranks)
        if budget <= 0 or not workers:
            return
        from .groups import format_groups  # benchmark 1: stacks only

        text = format_groups(self._collect(workers, budget))
        self._survivors = f"Where the other ranks were (stacks before they were stopped):\n{text}"

    def survivors(self) -> str:
        """The survivors' stacks of the attempt's failure ("" when none were read)."""
        return self._survivors
