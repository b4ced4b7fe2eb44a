"""The elastic agent: rendezvous -> start workers -> watch them -> restart, finish or give up.

One ``Agent`` runs one node's share of a job, for the command line (``python -m xrun.runtime``)
and for ``xrun.runtime.launch`` alike. The watch is a single ``selectors`` loop over three kinds
of file descriptors, so nothing is polled on a timer:

* the workers' exit fds (pidfds / multiprocessing sentinels, ``PContext.fds()``),
* the rendezvous handler's fd (readable once the current round is stale: a peer failed, a node
  joined or was dropped, the job was closed),
* a signal wakeup fd (``signal.set_wakeup_fd``) for SIGTERM/SIGINT/... sent to the agent.

Decisions:

* A local worker fails -> stop the local workers, ask the peers to restart, and re-rendezvous,
  up to ``max_restarts`` times (``TORCHELASTIC_RESTART_COUNT`` counts these). A membership
  change (a peer failed, a node joined/left) restarts without using up a restart, as torchrun.
* A handled signal is forwarded to every worker's process group; after ``shutdown_timeout`` the
  survivors are SIGKILLed and the agent exits with ``128 + signum`` (the shell's convention; a
  scheduler reads it as "killed by signal". torchrun instead exits 1 with a SignalException
  traceback). This holds for non-termination signals in ``--signals-to-handle`` (SIGUSR2) too,
  which is what torchrun 2.13 does: every listed signal raises its SignalException, so the
  workers get the signal and the agent shuts down. A fixed-size job's rendezvous is closed so
  the peers exit at once; an elastic job's is left open (torchrun keeps it open too), so the
  remaining nodes re-form without this one once its heartbeats stop.

* Success: the workers all exited 0 -> ``handler.finish()``: the store's host waits for the
  other nodes (the exit barrier, conf ``exit_barrier_timeout``, 300 s) and closes the job.
  A CLOSED event while our workers run says whether the job *failed* (a peer gave up, the store
  was lost: exit 1 with the peer's reason) or *finished* without us (exit 0).
* The store's secret: a standalone agent (endpoint port 0) makes one up when the job brings
  none; it never reaches the workers' environment (see ``xrun.contract.AGENT_ONLY_ENV``).
* Logs: ``<log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}``
  (default log dir: a fresh temp dir; every directory the agent creates is 0700, its own error
  file 0600). ``n`` counts every start of the worker group, membership
  restarts included, so no attempt overwrites another's logs. A second agent of the same job on
  the same host with the same log dir gets ``<run_id>.1``.
* The workers' store is the rendezvous store: the agent that serves the rendezvous serves the
  workers' ``torch.distributed.TCPStore`` clients on the same port (torch's protocol, told apart
  by its first bytes), listening before any worker starts, as torchrun's agent does
  (``TORCHELASTIC_USE_AGENT_STORE=True``). Workers get ``MASTER_ADDR``/``MASTER_PORT`` of it:
  the rendezvous endpoint (``--master-addr``/``--master-port`` for the static backend), and
  each round's workers an empty key space.

Standard library only: no torch, so the agent starts and idles like a bare interpreter.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from xrun.errors import UsageError
from xrun.record import Record

from .config import (
    LaunchConfig,
    WorkerGroup,
    launch_worker_env,
    log_line_prefix,
    parse_signals,
    random_uuid,
    substitute_local_rank,
    worker_env,
)
from .diagnose.watch import Diagnostics
from .errors import AgentFailedError, ChildFailedError, ProcessFailure, format_failures, root_cause
from .errors.deaths import OomWatch
from .events import AgentEvent, JobClosed, RendezvousChanged, Signalled, Stalled, WorkersDone
from .logdirs import AttemptDirs
from .rendezvous import (
    Endpoint,
    RendezvousClosedError,
    RendezvousError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParams,
    create_handler,
)
from .restarts import Restarts, node_id_for
from .signals import AgentSignal, SignalWatch
from .snapshot_keep import Keep
from .stopping import STOP_MARK, StopControl, stop_signal_of
from .workers.api import PContext, RunProcsResult, start_processes
from .workers.logs_specs import DefaultLogsSpecs

if TYPE_CHECKING:
    from .eventlog import EventLog
    from .timer import FileTimerServer


class RunResult(Record):
    """What ``Agent.run`` ended with. ``exitcode`` is the agent's: 0, 1 or 128+signal. A plain
    record: a dataclass costs every agent's start-up (benchmark 1) ~0.5 ms to make."""

    _fields = ("exitcode", "return_values", "failures", "message")
    __slots__ = (*_fields, "by_peer")

    def __init__(
        self,
        exitcode: int,
        return_values: dict[int, Any] | None = None,
        failures: dict[int, ProcessFailure] | None = None,
        message: str = "",
        by_peer: bool = False,
    ) -> None:
        self.exitcode = exitcode
        # both by global rank
        self.return_values: dict[int, Any] = {} if return_values is None else return_values
        self.failures: dict[int, ProcessFailure] = {} if failures is None else failures
        self.message = message  # the failure summary / reason ("" on success)
        # failed because another node did: the root cause is a peer's (its exit record says so)
        self.by_peer = by_peer

    def error(self, name: str) -> AgentFailedError | None:
        if self.exitcode == 0:
            return None
        if self.failures:
            return ChildFailedError(name, self.failures)
        return AgentFailedError(self.message, self.exitcode)


def _log(msg: str) -> None:
    print(f"[xrun-agent {os.getpid()}] {msg}", file=sys.stderr, flush=True)


class Agent:
    """Runs one node's workers for ``config``: ``Agent(cfg, "python", ("-u", "train.py")).run()``.

    ``entrypoint`` is a binary (run with ``args``) or a function (run in multiprocessing
    workers with ``args``; its return values come back in ``RunResult.return_values``).
    """

    def __init__(
        self,
        config: LaunchConfig,
        entrypoint: Callable[..., Any] | str,
        args: tuple[Any, ...] = (),
        name: str | None = None,
    ) -> None:
        if not config.run_id:  # standalone: a fresh id per job, like torchrun --standalone
            config = replace(config, run_id=random_uuid())
        self.config = config
        self.entrypoint = entrypoint
        self.args = args
        if name is None:
            name = (
                entrypoint
                if isinstance(entrypoint, str)
                else str(getattr(entrypoint, "__qualname__", entrypoint))
            )
        self.name: str = name
        self.host = socket.gethostname()
        self._signals = SignalWatch(parse_signals(config.signals_to_handle))
        self._logs = AttemptDirs(config.log_dir, config.run_id)
        self._restart_count = 0  # failure restarts used (TORCHELASTIC_RESTART_COUNT)
        self._restarts = Restarts(config.max_restarts, _log)  # the agent's or the job's count
        self._oom: OomWatch | None = None  # the OOM kill counters at the attempt's start
        self._timer: FileTimerServer | None = None  # TORCHELASTIC_ENABLE_FILE_TIMER=1
        self._events: EventLog | None = None
        if config.event_log_handler == "console":
            from .eventlog import EventLog, entry_point_name  # benchmark 1: only when asked

            self._events = EventLog(
                "console", config.run_id, config.role, self.host, config.rdzv_backend,
                entry_point_name(entrypoint),
            )  # fmt: skip
        # xrun stacks (its request FIFO), the stall watchdog, survivors' stacks: runtime/diagnose
        self._diag = Diagnostics(
            config.stall_timeout, config.shutdown_timeout, self.host, config.stall_silent_timeout
        )
        # graceful stops: workers that watch get a flag and the grace, not the signal
        self._stop = StopControl(config.run_id, config.shutdown_timeout)
        # The workers' /dev/shm snapshots, held while we wait between attempts (snapshot_keep)
        self._snapshots = Keep(config.run_id)
        self._pool: Any = None  # --recover warm: workers.pool.WarmPool (False: cannot serve)

    # -- public -------------------------------------------------------------------------------

    def run(self) -> RunResult:
        cfg = self.config
        endpoint = cfg.endpoint or Endpoint("localhost", 0)
        params = RendezvousParams(
            backend=cfg.rdzv_backend,
            endpoint=endpoint,
            run_id=cfg.run_id,
            min_nodes=cfg.min_nodes,
            max_nodes=cfg.max_nodes,
            local_world_size=cfg.nproc_per_node,
            conf=dict(cfg.rdzv_conf),
            node_rank=cfg.node_rank,
            local_addr=cfg.local_addr,
            # port 0: this agent serves the store on a port no other agent learns
            private_store=endpoint.port == 0,
            node_id=node_id_for(cfg.max_nodes, cfg.rdzv_backend),
            spares=cfg.spares,
        )
        restore = self._signals.install()
        undo_diag = self._diag.install()
        handler: RendezvousHandler | None = None
        result: RunResult | None = None
        try:
            try:
                self._signals.raising = True
                self._signals.check()
                if cfg.logs_specs is None and cfg.log_dir != os.devnull:
                    self._logs.prepare()  # a bad --log-dir: exit 2 before any peer waits for us
                handler = create_handler(params)
                if cfg.spares and self._warm_pool():  # --recover warm: a spare parks warm,
                    handler.warm_spares(self._pool)  # with the job's modules (issue #35)
                result = self._loop(handler)
            except AgentSignal as s:
                result = self._on_signal_exit(handler, None, s.signum)
            if self._events is not None:
                self._events.finished(result, self._restart_count)
            return result
        finally:
            self._signals.raising = False
            if handler is not None:
                handler.shutdown()
            if self._timer is not None:
                self._timer.stop()
            self._stop.remove()
            self._snapshots.release(touch=False)
            if self._pool:
                self._pool.close()
            undo_diag()
            restore()
            # A failed worker's files stay: the failure report points at them.
            if result is not None and result.failures and self._logs.temp:
                _log(f"the workers' logs are kept in {self._logs.temp} (no --log-dir given)")
            else:
                self._logs.remove_temp()

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self, handler: RendezvousHandler) -> RunResult:
        while True:
            self._signals.raising = True
            self._signals.check()  # one that arrived while the workers were being stopped
            t0 = time.monotonic()
            self._snapshots.hold()  # no worker holds them now: the wait may be long
            try:
                info = handler.next_rendezvous()
            except RendezvousClosedError as e:
                failed = getattr(e, "failed", True)
                reason = getattr(e, "reason", "") or str(e)
                if not failed:
                    return RunResult(0, message=reason)
                if signum := stop_signal_of(reason):  # a spare: stopped as the members are
                    name = signal.Signals(signum).name
                    return RunResult(128 + signum, message=f"stopped on request ({name})")
                return RunResult(1, message=f"the job was closed by a peer: {reason}", by_peer=True)
            except RendezvousError as e:
                return RunResult(1, message=f"rendezvous failed: {type(e).__name__}: {e}")
            self._restart_count = self._restarts.sync(handler)
            if self._events is not None:
                self._events.rendezvous(time.monotonic() - t0, self._restart_count)
            # Still raising while the workers start: a SIGTERM/SIGINT during the start of many
            # workers ends it at once (start_processes takes down the ones already started).
            try:
                pc = self._start(info, handler)
                self._snapshots.release()
            except UsageError as e:  # e.g. the log dir filled up: tell the peers, then exit 2
                self._close_quietly(handler, str(e))
                raise
            self._signals.raising = False
            outcome = self._on_event(self._watch(pc, handler), handler, pc, info)
            if outcome is not None:
                return outcome

    def _on_event(
        self, event: AgentEvent, handler: RendezvousHandler, pc: PContext, info: RendezvousInfo
    ) -> RunResult | None:
        """What ``event`` ends the run with; None: join the next round."""
        match event:
            case Signalled(signum) if self._stop.handles(signum) and self._stop.watched():
                return self._stop_gracefully(handler, pc, signum, "signal")
            case RendezvousChanged(reason) if stop_signal_of(reason):
                if not self._stop.watched():  # our workers do not watch: the signal, as before
                    return self._on_signal_exit(handler, pc, stop_signal_of(reason))
                return self._stop_gracefully(handler, pc, stop_signal_of(reason), "peer")
            case Signalled(signum):
                return self._on_signal_exit(handler, pc, signum)
            case JobClosed(reason, failed):
                pc.close(signal.SIGTERM, self.config.shutdown_timeout)
                if not failed:  # finished without this node (nothing of ours failed)
                    _log(f"the job was closed as finished ({reason}): workers stopped")
                    return RunResult(0, message=reason)
                if handler.lost:  # this node lost the rendezvous itself
                    return RunResult(1, message=reason)
                return RunResult(1, message=f"the job was closed by a peer: {reason}", by_peer=True)
            case RendezvousChanged(reason):
                if (done := self._restarts.settle(handler, pc)) is not None:  # ours failed too
                    return self._workers_done(done, handler, pc, info)
                pc.close_for_restart(self.config.shutdown_timeout)
                _log(f"membership changed ({reason}): restarting the workers")
                return None
            case WorkersDone(result):
                return self._workers_done(result, handler, pc, info)
            case Stalled(reason, report):
                pc.close(signal.SIGTERM, self.config.shutdown_timeout)
                return self._stalled(reason, report, handler)

    def _workers_done(
        self,
        result: RunProcsResult,
        handler: RendezvousHandler,
        pc: PContext,
        info: RendezvousInfo,
    ) -> RunResult | None:
        """Finish when every worker succeeded; after a failure restart (None) or give up."""

        cfg = self.config
        offset = info.rank_offset
        if not result.is_failed():
            pc.close(signal.SIGTERM, cfg.shutdown_timeout)  # reaps, flushes the tee threads
            # every local rank, None for binaries (and functions that returned None)
            return self._finish(
                handler,
                {offset + r: result.return_values.get(r) for r in range(cfg.nproc_per_node)},
            )
        failures = {offset + r: f for r, f in result.failures.items()}
        # where the others were, read before pc.wait stopped them (bounded by shutdown_timeout)
        survivors = self._diag.survivors()
        pc.close(signal.SIGTERM, cfg.shutdown_timeout)
        from .errors.rootcause import explain_attempt  # benchmark 1: a failed attempt only

        explain_attempt(failures, offset, result.stderrs, pc.sent_signals(), self._oom, self._timer)
        root = failures[root_cause(failures)]
        reason = f"local_rank {root.local_rank} on {self.host} failed: {root.reason()}"
        if self._restarts.spend(handler, reason):
            self._restart_count = self._restarts.used
            _log(f"{reason}; restarting the workers ({self._restart_count}/{cfg.max_restarts})")
            for line in filter(None, (self._restarts.line, survivors)):
                _log(line)
            self._request_restart(handler, reason)
            return None
        head = self._restarts.give_up(handler, reason)
        message = format_failures(self.name, failures)
        return RunResult(1, failures=failures, message=f"{head}{message}\n{survivors}".rstrip())

    def _stalled(self, reason: str, report: str, handler: RendezvousHandler) -> RunResult | None:
        """A stall ends the attempt like a failed worker: restart while restarts are left."""
        cfg = self.config
        if self._restarts.spend(handler, reason):
            self._restart_count = self._restarts.used
            _log(f"{reason}; restarting the workers ({self._restart_count}/{cfg.max_restarts})")
            _log(report)
            self._request_restart(handler, reason)
            return None
        head = self._restarts.give_up(handler, reason)
        return RunResult(1, message=f"{reason}\n{head}{report}")

    @staticmethod
    def _close_quietly(handler: RendezvousHandler, reason: str) -> None:
        """Close the job as failed; the store host may be gone already (our exit code says it)."""
        try:
            handler.close(failed=True, reason=reason)
        except RendezvousError:
            pass

    def _request_restart(self, handler: RendezvousHandler, reason: str) -> None:
        try:
            handler.request_restart(reason)
        except RendezvousError as e:
            _log(f"could not tell the peers to restart ({e}); next_rendezvous will")

    def _finish(self, handler: RendezvousHandler, values: dict[int, Any]) -> RunResult:
        self._signals.raising = True
        try:
            # The exit barrier: conf exit_barrier_timeout (300 s), not close_timeout.
            late = handler.finish()
            if late:
                _log(
                    f"{', '.join(late)} did not finish within exit_barrier_timeout="
                    f"{handler.cfg.exit_barrier_timeout:g}s: the job was closed as failed"
                )
        except RendezvousClosedError as e:
            if getattr(e, "failed", False):
                reason = getattr(e, "reason", e)
                return RunResult(1, values, message=f"a peer failed: {reason}", by_peer=True)
        except RendezvousError as e:
            # Our workers all succeeded; a peer that vanished while we waited is its own
            # failure, and a rendezvous server gone at the end (etcd) fails nothing of ours.
            _log(f"warning: {e}")
        return RunResult(0, values)

    def _start(self, info: RendezvousInfo, handler: RendezvousHandler) -> PContext:
        cfg = self.config
        master_addr, master_port = handler.workers_address
        n = cfg.nproc_per_node
        t0 = time.monotonic()
        logs, error_file_of = self._logs_for_attempt(n)
        stop_env = self._stop.prepare()
        group = WorkerGroup(
            role=cfg.role,
            run_id=cfg.run_id,
            local_world_size=n,
            rank_offset=info.rank_offset,
            world_size=info.world_size,
            group_rank=info.group_rank,
            group_world_size=info.group_world_size,
            master_addr=master_addr,
            master_port=master_port,
            restart_count=self._restart_count,
            max_restarts=cfg.max_restarts,
            rdzv_round=info.round,
        )
        envs = {
            lr: {
                **worker_env(group, lr, error_file_of(lr)),
                **launch_worker_env(cfg, lr),
                **self._diag.worker_env(error_file_of(lr)),
                **stop_env,
            }
            for lr in range(n)
        }
        prefixes = {
            lr: log_line_prefix(cfg.log_line_prefix_template, cfg.role, lr, info.rank_offset + lr)
            for lr in range(n)
        }
        if self._timer is not None or os.environ.get("TORCHELASTIC_ENABLE_FILE_TIMER") == "1":
            from .timer import serve  # benchmark 1: the file timer only when asked

            self._timer = serve(self._timer, envs, cfg.run_id)
        if self._events is not None:
            world = (info.group_rank, info.group_world_size, info.world_size, info.rank_offset)
            self._events.ranks_assigned(time.monotonic() - t0, self._restart_count, world)
        pool = self._warm_pool()
        warm_before = pool.warm_starts if pool else 0
        pc = start_processes(
            name=cfg.role,
            entrypoint=self.entrypoint,
            args={lr: substitute_local_rank(self.args, lr) for lr in range(n)},
            envs=envs,
            log_line_prefixes=prefixes,
            start_method=cfg.start_method,
            numa_options=cfg.numa_options,
            duplicate_stdout_filters=cfg.duplicate_stdout_filters,
            duplicate_stderr_filters=cfg.duplicate_stderr_filters,
            stop_timeout=cfg.shutdown_timeout,
            warm_pool=pool,
            **logs,
        )
        if pool and pool.warm_starts > warm_before:
            _log(f"{pool.warm_starts - warm_before} of {n} workers started warm (--recover warm)")
        if self._timer is not None:
            self._timer.watch(pc.pids())
        # After the start, not before: the workers are starting meanwhile (an interpreter takes
        # milliseconds before it can allocate anything worth an OOM kill).
        self._oom = OomWatch.start(self._oom)
        if self._events is not None:
            self._events.started(pc.pids(), self._restart_count)
        kv = handler.kv if cfg.max_nodes > 1 else None
        timer = self._timer
        beats = (lambda: timer.requests) if timer is not None else None
        self._diag.attach(pc, info, self._logs.run_dir, kv, beats)
        if self._pool:
            self._pool.attach(pc)  # a failure's survivors are replaced at once; refills
        return pc

    def _warm_pool(self) -> Any:
        """The pool of warm interpreters (``--recover warm``), made at the first start."""
        if self._pool is None and self.config.recover == "warm":
            from .workers.pool import pool_for  # benchmark 1: --recover warm only

            self._pool = pool_for(self.entrypoint, self.args, self.config, _log)
        return self._pool or None

    def _logs_for_attempt(self, n: int) -> tuple[dict[str, Any], Callable[[int], str]]:
        """start_processes' log arguments for the next attempt, and each rank's error file
        ("": the LogsSpecs sets it): the config's LogsSpecs, nothing for ``--log-dir
        /dev/null`` (torchrun's), else xrun's attempt dirs."""
        cfg = self.config
        if cfg.logs_specs is not None or cfg.log_dir == os.devnull:
            specs = cfg.logs_specs or DefaultLogsSpecs(
                os.devnull, cfg.redirects, cfg.tee, cfg.local_ranks_filter
            )
            return {"logs_specs": specs}, lambda lr: ""
        attempt_dir = self._logs.next(n)
        logs = {
            "log_dir": attempt_dir,
            "redirects": cfg.redirects,
            "tee": cfg.tee,
            "local_ranks_filter": cfg.local_ranks_filter,
        }
        return logs, lambda lr: os.path.join(attempt_dir, str(lr), "error.json")

    def _watch(self, pc: PContext, handler: RendezvousHandler) -> AgentEvent:
        """Block until the workers end, the rendezvous changes or a signal arrives."""
        sel = selectors.DefaultSelector()
        try:
            worker_fds = set(pc.fds())
            for fd in worker_fds:
                sel.register(fd, selectors.EVENT_READ, "worker")
            try:
                sel.register(handler.fileno(), selectors.EVENT_READ, "rdzv")
            except RendezvousClosedError as e:
                return JobClosed(e.reason, e.failed)
            # The watch's answer may have come in already, read by a call that shared the
            # connection: then the fd will not turn readable for it.
            event = handler.poll_event()
            if event is not None:
                return _rendezvous_event(*event, failed=handler.closed_failed)
            self._register_wakeups(sel)
            # Without an exit fd per worker fall back to polling every monitor_interval.
            timeout = self._diag.timeout(
                None
                if len(worker_fds) >= self.config.nproc_per_node
                else self.config.monitor_interval
            )
            while True:
                if self._signals.signum:
                    return Signalled(self._signals.signum)
                result = pc.wait(0)
                if result is not None:
                    return WorkersDone(result)
                stalled = self._diag.check()  # also answers an `xrun stacks` request
                if stalled is not None:
                    return stalled
                # wait() closes the fd of a worker it reaped: forget it before select sees a
                # closed (or, worse, reused) fd number.
                running = set(pc.fds())
                for fd in worker_fds - running:
                    sel.unregister(fd)
                worker_fds &= running
                # --recover warm: a refill is spawned from here, once the new workers started
                for key, _ in sel.select(self._pool.tick(timeout) if self._pool else timeout):
                    if key.data == "worker":
                        # A pidfd stays readable after its process exits: stop watching it, or
                        # the loop would spin while the other workers still run.
                        sel.unregister(key.fd)
                        worker_fds.discard(key.fd)
                    elif key.data == "signal":
                        self._signals.drain()
                    elif key.data == "rdzv":
                        event = handler.poll_event()
                        if event is not None:
                            return _rendezvous_event(*event, failed=handler.closed_failed)
        finally:
            sel.close()

    def _register_wakeups(self, sel: selectors.BaseSelector) -> None:
        """The watch's other wake-ups: a signal, and an `xrun stacks` request (read and answered
        by the loop's ``self._diag.check()``)."""
        if self._signals.fd >= 0:
            sel.register(self._signals.fd, selectors.EVENT_READ, "signal")
        if self._diag.request_fd >= 0:
            sel.register(self._diag.request_fd, selectors.EVENT_READ, "stacks")

    # -- signals -------------------------------------------------------------------------------

    def _stop_gracefully(
        self, handler: RendezvousHandler, pc: PContext, signum: int, origin: str
    ) -> RunResult:
        """A stop request (runtime/stopping.py): the workers stop at an agreed step and save;
        they get the whole grace for it."""
        name = signal.Signals(signum).name
        self._stop.request(signum, origin)
        if origin == "signal":  # the peers' agents learn it through the store
            self._request_restart(handler, f"{STOP_MARK}{name} on {self.host}")
        grace = self._stop.grace()
        _log(f"{name} ({origin}): stop requested; the workers have {grace:g}s to stop")
        killed = self._stop.wait(pc, grace)
        if killed:
            _log(f"{killed} worker(s) still ran after the {grace:g}s grace: stopped")
        self._close_quietly(handler, f"stopped on request ({name})")
        return RunResult(128 + signum, message=f"stopped on request ({name})")

    def _on_signal_exit(
        self, handler: RendezvousHandler | None, pc: PContext | None, signum: int
    ) -> RunResult:
        self._signals.raising = False
        name = signal.Signals(signum).name
        _log(f"got {name}: forwarding it to the workers and shutting down")
        if pc is not None:
            pc.close(signum, self.config.shutdown_timeout)
        if handler is not None and self.config.min_nodes == self.config.max_nodes:
            try:
                handler.close(failed=True, reason=f"the agent on {self.host} got {name}")
            except RendezvousError:
                pass
        return RunResult(128 + signum, message=f"the agent got {name}")


def _rendezvous_event(
    event: RendezvousEvent, reason: str, failed: bool
) -> JobClosed | RendezvousChanged:
    """The agent's event for what ``handler.poll_event`` reported."""
    if event.name == "CLOSED":
        return JobClosed(reason, failed)
    return RendezvousChanged(reason)
