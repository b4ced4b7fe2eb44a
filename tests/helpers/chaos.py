"""The chaos driver of ``tests/e2e/test_chaos.py`` (its /proc helpers also serve the local_cwd signal tests): finds a job's agents and workers through /proc,
SIGKILLs them on a seeded random schedule, and meanwhile checks every checkpoint file it can see.

A job is recognised by a ``marker`` string unique to the test (its checkpoint dir) that appears
on the command line of its agents (``python -m xrun.runtime ... script --checkpoint-dir MARKER``)
and of their workers. A worker is a process whose parent is one of those agents: the agent's
own command line also names the script, so "cmdline contains the script" alone is not enough.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CKPT_RE = re.compile(r"^epoch-(\d+)\.pt$")
TMP_RE = re.compile(r"^epoch-\d+\.pt\.tmp-(\d+)$")


# ----------------------------------------------------------------------------------- /proc
def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return -1
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        k, sep, v = item.decode(errors="replace").partition("=")
        if sep:
            out[k] = v
    return out


def alive(pid: int) -> bool:
    """Running (not a zombie, not gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def agents(marker: str) -> list[int]:
    """The job's runtime agents (``python -m xrun.runtime ...`` naming ``marker``), live ones."""
    out = []
    for pid in pids():
        argv = cmdline(pid)
        if "xrun.runtime" in argv and any(marker in a for a in argv) and alive(pid):
            out.append(pid)
    return sorted(out)


@dataclass(frozen=True)
class Worker:
    pid: int
    agent: int
    rank: int
    group_rank: int
    restart: int


def workers(marker: str) -> list[Worker]:
    """The live workers of the job's agents, with their ranks from their environment."""
    ags = set(agents(marker))
    out = []
    for pid in pids():
        parent = ppid(pid)
        if parent not in ags or not alive(pid):
            continue
        if not any(marker in a for a in cmdline(pid)):
            continue  # some other helper of the agent
        env = environ(pid)
        if "RANK" not in env:
            continue
        out.append(
            Worker(
                pid,
                parent,
                int(env["RANK"]),
                int(env.get("GROUP_RANK", "-1")),
                int(env.get("TORCHELASTIC_RESTART_COUNT", "-1")),
            )
        )
    return sorted(out, key=lambda w: w.rank)


def listening_pid(port: int, candidates: list[int]) -> int | None:
    """Which of ``candidates`` holds a socket listening on TCP ``port`` (the rendezvous store)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                        inodes.add(cols[9])
        except OSError:
            continue
    for pid in candidates:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return pid
    return None


def kill_all(marker: str) -> None:
    """Test clean-up: SIGKILL every process whose command line names ``marker``."""
    me = os.getpid()
    for pid in pids():
        if pid != me and any(marker in a for a in cmdline(pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# -------------------------------------------------------------------------- checkpoints
def newest_epoch(ckpt_dir: Path) -> int:
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return 0
    return max((int(m[1]) for n in names if (m := CKPT_RE.match(n))), default=0)


@dataclass
class Kill:
    pid: int
    what: str  # "worker rank 3 (restart 0)" / "agent 1234"
    at_epoch: int
    t: float


@dataclass(eq=False)  # eq=False keeps Thread hashable (threading keys its tables by thread)
class Chaos(threading.Thread):
    """Runs beside the job: ``kills`` SIGKILLs of random workers (``target="worker"``) or one
    SIGKILL of a whole agent (``target="agent"``, chosen by ``pick_agent``), each once the
    newest checkpoint has passed the previous kill's epoch, after a random delay of up to
    ``max_delay_s``; and all along, every complete checkpoint file it sees is loaded."""

    marker: str
    ckpt_dir: Path
    kills: int
    seed: int
    nworkers: int
    first_epoch: int = 2
    max_delay_s: float = 0.3
    target: str = "worker"
    rdzv_port: int = 0
    done: list[Kill] = field(default_factory=list)
    load_errors: list[str] = field(default_factory=list)
    loaded: int = 0
    tmp_seen: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        super().__init__(daemon=True, name="chaos")
        self.rng = random.Random(self.seed)
        self._verified: dict[str, tuple[int, int]] = {}

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # reported by the test
            self.error = e

    def _loop(self) -> None:
        threshold = self.first_epoch
        kill_at: float | None = None
        while not self.stop.is_set():
            self.check_checkpoints()
            if len(self.done) < self.kills:
                epoch = newest_epoch(self.ckpt_dir)
                ws = workers(self.marker)
                if kill_at is None and epoch >= threshold and len(ws) == self.nworkers:
                    kill_at = time.monotonic() + self.rng.uniform(0, self.max_delay_s)
                if kill_at is not None and time.monotonic() >= kill_at and ws:
                    if self._kill(ws, epoch):
                        threshold = epoch + 1
                    kill_at = None
            time.sleep(0.01)
        self.check_checkpoints()

    def _kill(self, ws: list[Worker], epoch: int) -> bool:
        if self.target == "agent":
            ags = sorted({w.agent for w in ws})
            host = listening_pid(self.rdzv_port, ags) if self.rdzv_port else None
            # Not the store's host; among the others the one whose workers have the top ranks.
            others = [a for a in ags if a != host] or ags
            victim = max(others, key=lambda a: max(w.rank for w in ws if w.agent == a))
            what = (
                f"agent {victim} (ranks {[w.rank for w in ws if w.agent == victim]}, "
                f"store host {host})"
            )
        else:
            w = self.rng.choice(ws)
            victim, what = w.pid, f"worker rank {w.rank} (restart {w.restart})"
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.done.append(Kill(victim, what, epoch, time.monotonic()))
        return True

    def check_checkpoints(self) -> None:
        """Load every complete-named checkpoint not yet loaded in this version (by inode and
        mtime): a reader must never see half a file. Temp names are recorded."""
        import torch

        try:
            names = os.listdir(self.ckpt_dir)
        except FileNotFoundError:
            return
        for name in names:
            if TMP_RE.match(name):
                self.tmp_seen.add(name)
            m = CKPT_RE.match(name)
            if m is None:
                continue
            path = self.ckpt_dir / name
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            key = (st.st_ino, st.st_mtime_ns)
            if self._verified.get(name) == key:
                continue
            try:
                state = torch.load(path, weights_only=True)
                if int(state["epoch"]) != int(m[1]) or not state["model"]:
                    raise ValueError(f"epoch {state['epoch']} / keys {list(state)}")
            except FileNotFoundError:
                continue
            except Exception as e:  # noqa: BLE001 - any failure to load is the finding
                self.load_errors.append(f"{name}: {type(e).__name__}: {e}")
            self.loaded += 1
            self._verified[name] = key


def runtime_agent(**env: str) -> int:
    """The pid of the runtime agent (``python3 -m xrun.runtime``) whose environment holds every
    ``env`` item (e.g. ``XRUN_NODE_ID``, ``SLURM_JOB_ID``): one replica's agent."""
    for pid in pids():
        if "xrun.runtime" in cmdline(pid) and env.items() <= environ(pid).items():
            return pid
    raise AssertionError(f"no runtime agent with {env}")
