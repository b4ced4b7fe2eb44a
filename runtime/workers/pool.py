"""``--recover warm``: the agent's pool of warm interpreters, and how a rank is started from one.

A cold restart pays for a fresh interpreter, ``import torch`` (2+ s of CPU) and the ~800 modules
``DistributedDataParallel`` imports on its first use (2 s more) before the world can re-form.
With ``--recover warm`` every worker of the job is started through ``warm_child.py`` (run by the
job's own interpreter, with the job's interpreter flags, spawned by ``subprocess``: a clean
exec, never a fork of a process that imported torch; the agent itself never imports torch):

* a first attempt (or an empty pool) spawns a *cold* child per rank and hands it the rank at
  once: it runs the script as a cold worker would, a few milliseconds later;
* each worker writes the names of the library modules it holds into the pool's folder a few
  times in its first minute (``warm_child._report``);
* after every start of the workers the pool is refilled to ``size`` *warm* children: they wait
  for those reports, import ``torch`` and every reported module, and idle. A refill after a
  restart is spawned ``REFILL_AFTER`` s after the start (from the agent's watch loop,
  ``tick``) and imports ``REFILL_DELAY`` s after that, so that it does not take the CPU from
  the workers it just replaced while they form their group: four interpreters starting
  beside them made ``init_process_group`` take 0.22-0.25 s instead of 0.09 s on a 2-core host
  (docs/benchmark-runs/2026-11-27-warm-breakdown.txt);
* a restarted rank is the readiest pool child: it gets the rank's full environment, argv, cwd
  and its two output fds (the log files or tee pipes the launcher made, or the agent's own
  console), and runs the script as ``__main__``.

To the agent's machinery a pool child is a cold worker: spawned from the agent's main thread
with the same ``preexec`` (own session and process group, ``PR_SET_PDEATHSIG=SIGKILL``, so an
idle child dies with the agent, ``kill -9`` included), its pid and ``Popen`` are the worker's,
its exit code is the script's, its error file the rank's ``TORCHELASTIC_ERROR_FILE``. A child
idles in ``select`` (one ``stat`` per report file every 2 s). Only ``python [-u] [-B] script``
and ``python [-u] [-B] -m module`` commands are served; anything else starts cold.

Standard library only; imported by the agent only when ``--recover warm`` is on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from xrun.contract import AGENT_ONLY_ENV

from .child import make_preexec

__all__ = [
    "CHILD",
    "REFILL_AFTER",
    "REFILL_DELAY",
    "Command",
    "WarmPool",
    "parse_command",
    "pool_for",
]

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_child.py")
REFILL_AFTER = 1.0  # seconds after a restart's start before its refill is spawned
_LOOK = 2.0  # seconds between the agent's looks for a child's no-room note while it warms
_SHARE_LOOK = 2.0  # seconds between looks at the workers' reports, to share them with spares
REFILL_DELAY = 1.0  # seconds a refilled child then waits before it imports (see the docstring)
_FLAGS = ("-u", "-B")  # interpreter options a pool child can be started with
_PYTHON = re.compile(r"python[0-9.]*$")


class Command(NamedTuple):
    """A worker command the pool can serve: ``python *flags script args`` or ``-m module``."""

    python: str
    flags: tuple[str, ...]
    module: str | None
    argv: tuple[str, ...]  # (script, *args) or (module, *args)


def parse_command(cmd: Sequence[str]) -> Command | None:
    """``cmd`` as a ``Command``; None when the pool cannot run it (not a Python interpreter,
    or an interpreter option other than ``-u``/``-B``: those shape the interpreter at start)."""
    if not cmd or not _PYTHON.search(os.path.basename(cmd[0])):
        return None
    rest = list(cmd[1:])
    flags = []
    while rest and rest[0] in _FLAGS:
        flags.append(rest.pop(0))
    if len(rest) >= 2 and rest[0] == "-m":
        return Command(cmd[0], tuple(flags), rest[1], tuple(rest[1:]))
    if not rest or rest[0].startswith("-"):
        return None
    return Command(cmd[0], tuple(flags), None, tuple(rest))


class _Child:
    __slots__ = ("proc", "ready", "sock")

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.ready = False

    def check_ready(self) -> bool:
        """Has it said it is warm (one byte, read without blocking)?"""
        if not self.ready:
            with contextlib.suppress(BlockingIOError, OSError):
                self.ready = self.sock.recv(1, socket.MSG_DONTWAIT) == b"R"
        return self.ready


class WarmPool:
    """Warm interpreters for one job's worker command. ``WarmPool.create`` or None."""

    def __init__(self, command: Command, size: int, state_dir: str) -> None:
        self.command = command
        self.size = size
        self.dir = state_dir  # the workers' module reports, the children's own output
        self._idle: list[_Child] = []
        self._log = os.open(
            os.path.join(state_dir, "warm.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )
        self._parent = os.getpid()
        self._fills = 0
        self._pending: tuple[float, dict[str, str]] | None = None  # (when, env): a refill due
        self.warm_starts = 0  # ranks started from a warm (ready) child
        self.log: Callable[[str], None] | None = None  # the agent's, until it said no-room
        self.starts = 0
        # --spares: publishes the reported modules to the spares (handler.warm_spares)
        self.share: Callable[[list[str]], None] | None = None
        self._shared: set[str] = set()
        self._look = (0.0, 0.0)  # (next look at the reports, last one): while workers report

    @classmethod
    def create(cls, entrypoint: str, args: Sequence[Any], size: int) -> WarmPool | None:
        command = parse_command([entrypoint, *map(str, args)])
        if command is None:
            return None
        import tempfile  # benchmark 1: --recover warm only

        return cls(command, size, tempfile.mkdtemp(prefix="xrun-warm-"))

    def serves(self, cmd: Sequence[str]) -> Command | None:
        c = parse_command(cmd)
        if c is None or c.python != self.command.python or c.flags != self.command.flags:
            return None
        return c

    # -- starting a rank -----------------------------------------------------------------------

    def start(
        self,
        rank: int,
        command: Command,
        env: Mapping[str, str],
        out: int | None,
        err: int | None,
        cpus: set[int] | None,
    ) -> subprocess.Popen[bytes]:
        """Run ``command`` as local rank ``rank`` in the readiest child (a fresh cold one when
        none is left); ``out``/``err``: the worker's stream fds (None: the agent's own)."""
        job = {
            "argv": list(command.argv),
            "module": command.module,
            "env": dict(env),
            "cwd": os.getcwd(),
            "cpus": sorted(cpus) if cpus else None,
            "report": os.path.join(self.dir, f"modules.{rank}"),
        }
        payload = json.dumps(job).encode()
        fds = [1 if out is None else out, 2 if err is None else err]
        self.starts += 1
        while True:
            child = self._take()
            if child is None:
                child = self._spawn("cold", 0.0, env)
            elif child.ready:
                self.warm_starts += 1
            try:
                socket.send_fds(child.sock, [payload], fds)
            except OSError:  # it died meanwhile: the next one
                self._discard(child)
                continue
            child.sock.close()
            return child.proc

    def _take(self) -> _Child | None:
        """The first ready child, else the oldest still warming (it is ahead of a cold one)."""
        alive = []
        for c in self._idle:
            if c.proc.poll() is None:
                alive.append(c)
            else:
                c.sock.close()
        self._idle = alive
        for c in alive:
            if c.check_ready():
                alive.remove(c)
                return c
        return alive.pop(0) if alive else None

    # -- the pool ------------------------------------------------------------------------------

    def attach(self, pc: Any) -> None:
        """Called with each attempt's ``PContext`` once its workers started: a failure (or a
        peer's, a membership change) SIGKILLs the survivors at once, without reading their
        stacks first (py-spy, up to 3 s): replacing them fast is the point of the pool (see
        ``PContext.close_for_restart``); then the pool is refilled (after the start: the new
        workers go first)."""
        pc.before_stop = None
        pc.kill_survivors = True
        self.refill(pc.envs)
        now = time.monotonic()  # the workers report for 90 s (warm_child._REPORT_AT)
        self._look = (now + _SHARE_LOOK, now + 95.0)

    def refill(self, envs: Mapping[int, Mapping[str, str]]) -> None:
        """Top the pool up to ``size`` warm children, started with what every rank's
        environment shares (a module that reads, say, ``OMP_NUM_THREADS`` at import time sees
        the worker's value; the rank's own variables are set at the hand-over)."""
        base = {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV}
        ranks = [{**base, **e} for e in envs.values()]
        common = dict(ranks[0]) if ranks else base
        for e in ranks[1:]:
            common = {k: v for k, v in common.items() if e.get(k) == v}
        if self._fills:  # a restart: later, from tick()
            self._pending = (time.monotonic() + REFILL_AFTER, common)
        else:
            self._fill(0.0, common)
        self._fills += 1

    def tick(self, timeout: float | None) -> float | None:
        """From the agent's watch loop (its main thread: the children's parent-death signal
        is tied to it): spawn a refill that is due; ``timeout`` shortened to when the next is."""
        if self.log is not None:
            if os.path.exists(os.path.join(self.dir, "no-room")):
                with contextlib.suppress(OSError), open(os.path.join(self.dir, "no-room")) as f:
                    self.log(f.read())  # once: a child wrote why the pool cannot fill
                self.log = None
            elif not all(c.check_ready() for c in self._idle):
                # children still warming may find no room under a memory limit: look again
                timeout = _LOOK if timeout is None else min(timeout, _LOOK)
        if self.share is not None and self._look[0]:
            timeout = self._share(timeout)
        if self._pending is None:
            return timeout
        due, env = self._pending
        left = due - time.monotonic()
        if left > 0:
            return left if timeout is None else min(timeout, left)
        self._pending = None
        self._fill(REFILL_DELAY, env)
        return timeout

    def _share(self, timeout: float | None) -> float | None:
        """Every ``_SHARE_LOOK`` s while the workers report: hand the spares what they added."""
        now = time.monotonic()
        if now >= self._look[0]:
            from .warm_child import _reported_modules  # stdlib only; --spares only

            names = _reported_modules(self.dir)
            if not self._shared.issuperset(names):
                self._shared.update(names)
                assert self.share is not None
                self.share(sorted(self._shared))
            self._look = (now + _SHARE_LOOK, self._look[1]) if now < self._look[1] else (0.0, 0.0)
        left = max(0.0, self._look[0] - now) if self._look[0] else None
        return left if timeout is None or left is None else min(timeout, left)

    def take_modules(self, names: list[str]) -> None:
        """A spare: the modules the job's workers import (spares.Modules), for the idle
        children to import (they look at the reports every 2 s)."""
        path = os.path.join(self.dir, "modules.spare")
        with open(path + ".tmp", "w", encoding="utf-8") as f:  # .tmp: not read as a report
            f.write("\n".join(names) + "\n")
        os.replace(path + ".tmp", path)

    def _fill(self, delay: float, env: Mapping[str, str]) -> None:
        while len(self._idle) < self.size:
            self._idle.append(self._spawn("warm", delay, env))

    def prewarm(self) -> None:
        """A spare agent (``--spares``) runs no workers until it inherits a lost node's slot:
        warm ``size`` children now, from an empty module report (they import ``torch`` and
        idle, picking up the reports of the workers they later serve), so that the
        replacement's workers start warm."""
        with open(os.path.join(self.dir, "modules.spare"), "w"):
            pass
        self._fill(0.0, {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV})

    def ready(self) -> int:
        """How many children are warm now."""
        return sum(c.check_ready() for c in self._idle)

    def _spawn(self, mode: str, delay: float, env: Mapping[str, str]) -> _Child:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # From the agent's main thread, like every worker: the parent-death signal is tied
            # to the thread that forks.
            proc = subprocess.Popen(
                [
                    self.command.python,
                    *self.command.flags,
                    CHILD,
                    str(theirs.fileno()),
                    mode,
                    self.dir,
                    f"{delay:g}",
                ],
                env=dict(env),
                stdout=self._log,
                stderr=self._log,
                pass_fds=(theirs.fileno(),),
                preexec_fn=make_preexec(self._parent),
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return _Child(proc, ours)

    def _discard(self, child: _Child) -> None:
        child.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait()

    def close(self) -> None:
        """Stop the idle children (their group: anything they started too) and forget them."""
        idle, self._idle = self._idle, []
        for c in idle:
            self._discard(c)
        if self._log >= 0:
            os.close(self._log)
            self._log = -1
        import shutil  # benchmark 1: --recover warm only

        shutil.rmtree(self.dir, ignore_errors=True)


def pool_for(entrypoint: Any, args: Sequence[Any], config: Any, log: Callable[[str], None]) -> Any:
    """The agent's pool for its worker command (``config``: its ``LaunchConfig``), or False
    (logged) when the command is not one a pool can run: those workers start cold."""
    size = config.warm_pool_size or config.nproc_per_node
    pool = WarmPool.create(entrypoint, args, size) if isinstance(entrypoint, str) else None
    if pool is None:
        log("--recover warm serves `python [-u] script|-m module` workers: they start cold")
        return False
    pool.log = log
    if getattr(config, "spares", 0):  # the agent may be a spare: warm before it parks
        pool.prewarm()
    return pool
