"""Measure 21 (issues #34, #35): the recovery drill of measure 18 and the node-loss drill of
measure 20 on the suite's real backends, docker and slurm, through the schedulers themselves.

The job: ``dist.ddp -j 2x2`` of ``examples/train_ddp.py --print-steps`` (gloo, steps of 0.1 s,
``Snapshotter(replicated=True)``: a replacement gets the step from its peers' memory), submitted
with the scheduler's own ``submit`` (docker: the ``xrun-python`` image, torch bind-mounted from
this venv; slurm: the suite's four-node cluster, one node per replica). Faults, a few per job:

* ``worker killed, warm``: ``--recover warm``, ``kill -9`` of one worker of a node that does not
  hold rank 0 (issue #34's fault), once every agent's warm pool is full and the job is 30 s old.
* ``node lost, spare warm``: ``--spares S``, the node that neither serves the store (replica 0,
  docs/runtime.md) nor is a spare is lost: ``docker kill`` of its container; on slurm SIGKILL to
  its task's process group (agent, workers, the task's shell). A parked spare takes its slot.
  Issue #35's fault. A warm job takes both kinds in turn (``worker, node, worker, node...``).
* ``worker killed, cold``: ``--recover off``, the same worker kill: xrun's cold restart of one
  worker, the issues' reference.

The figure is the time from the kill to rank 0's first ``step S`` line after it (a full-world
step), as the lines arrive here: docker's log stream (``docker logs -f``), slurm's log files
(polled every 20 ms). Per fault also the steps lost (the last step before the kill minus the step
the world resumed after); per job its end state (SUCCEEDED: no survivor hung) and whether its
final parameters equal an undisturbed run's on the same backend (its ``--out`` sha256).
``XRUN_BENCH_DRILL_FAULTS`` sets the faults per contender (default 20, 1 with ``--smoke``),
``XRUN_BENCH_DRILL_BACKENDS`` the backends (default ``docker,slurm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, Unavailable
from benchmarks.recovery import _STARTED, _STEP, TRAIN, _children, _comm, _p95

NPROC = 2
STEP_SLEEP = 0.1  # issue #34's steps
SETTLE_S = 30.0  # a warm pool imports the modules the workers report in their first steps
CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout=300"
SITE = sysconfig.get_paths()["purelib"]  # torch, for the containers' python3 (3.11 both)
IMAGE = "xrun-python:latest"
SPARES = {"docker": 4, "slurm": 2}  # the slurm test cluster has 4 nodes: 2 active + 2 spares
WORKER, NODE = "worker killed", "node lost"
_RESUMED = re.compile(r"resuming after step (\d+)")


@dataclass
class Plan:
    """One job: its spares, its recovery mode and the faults it takes, in order."""

    spares: int
    recover: str
    faults: list[str] = field(default_factory=list)
    settle: float = SETTLE_S  # before the first fault under warm: the job this old


def contender(backend: str, kind: str, recover: str) -> str:
    how = "cold" if recover == "off" else ("spare warm" if kind == NODE else "warm")
    return f"xrun {backend}: {kind}, {how}"


# --- processes (the backends run on this host: their processes are in /proc here) -------------


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _nspid(pid: int) -> int:
    """The pid as its own pid namespace (a container's) numbers it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return pid


def workers(agent: int) -> list[int]:
    """The agent's workers: its children that are not warm interpreters."""
    return [k for k in _children(agent) if _comm(k) != "xrun-warm"]


def ready(agent: int) -> int:
    """The agent's warm interpreters that are ready: their marks in the pool's folder, seen
    through the agent's root (a container's /tmp is its own) and numbered as it numbers them."""
    kids = {_nspid(k) for k in _children(agent)}
    tmp = _environ(agent).get("TMPDIR", "/tmp")
    root = Path(f"/proc/{agent}/root{tmp}")
    try:
        marks = [m.name for d in root.glob("xrun-warm-*") for m in d.glob("ready.*")]
    except OSError:
        return 0
    return sum(int(m.rsplit(".", 1)[1]) in kids for m in marks if m.rsplit(".", 1)[1].isdigit())


def _agent_under(pid: int) -> int | None:
    todo = [pid]
    while todo:
        p = todo.pop()
        if "xrun.runtime" in _cmdline(p):
            return p
        todo += _children(p)
    return None


# --- output: every replica's lines, timestamped as they come ------------------------------------


class Lines:
    def __init__(self) -> None:
        self.q: queue.Queue[tuple[float, int, str]] = queue.Queue()
        self.tail: list[str] = []
        self.rank0 = 0  # the replica whose stream last had rank 0's start line
        self.step = -1  # the last step read
        self.stop = threading.Event()

    def put(self, k: int, line: str) -> None:
        self.q.put((time.monotonic(), k, line))

    def _read(self, k: int, line: str) -> None:
        self.tail = [*self.tail[-40:], f"{k}: {line}"]
        if _STARTED.search(line):
            self.rank0 = k
        if m := _STEP.search(line):
            self.step = int(m[1])

    def until(self, match: Callable[[str], bool], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            try:
                t, k, line = self.q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RunFailed(f"timed out; last lines: {' | '.join(self.tail[-4:])}") from None
            self._read(k, line)
            if match(line):
                return t

    def last_step(self) -> int:
        """Reads the lines that came so far: the last step read (-1: none yet)."""
        while True:
            try:
                _, k, line = self.q.get_nowait()
            except queue.Empty:
                return self.step
            self._read(k, line)


def _pump(lines: Lines, k: int, stream: Iterator[str]) -> None:
    for line in stream:
        if line.strip():
            lines.put(k, line.rstrip("\n"))


# --- the backends -------------------------------------------------------------------------------


def _train_args(out: str, total: int) -> list[str]:
    return ["--print-steps", "--step-sleep", str(STEP_SLEEP), "--epochs", "1",
            "--steps-per-epoch", str(total), "--checkpoint-dir", f"{out}/ckpt",
            "--out", f"{out}/out.json"]  # fmt: skip


class Docker:
    name = "docker"

    def __init__(self) -> None:
        probe = ["docker", "image", "inspect", IMAGE]
        if (
            shutil.which("docker") is None
            or subprocess.run(probe, capture_output=True, timeout=60).returncode
        ):
            raise Unavailable(f"no Docker Engine with {IMAGE} (scripts/docker-engine.sh image)")
        if not Path(SITE, "torch").is_dir():
            raise Unavailable(f"no torch in {SITE} to bind-mount")
        from xrun.schedulers.docker import DockerScheduler

        self.sched = DockerScheduler("default")
        self.names: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        self.pids: dict[str, int] = {}  # container -> its first process (the same all its life)

    def submit(self, plan: Plan, total: int, tmp: Path) -> tuple[str, Path]:
        from xrun.components.dist import ddp
        from xrun.schedulers.docker.request import container_name

        ws, out = tmp / "ws", tmp / "out"
        ws.mkdir()
        out.mkdir()
        shutil.copy(TRAIN, ws / "train_ddp.py")
        app = ddp(
            *_train_args("/out", total), script="train_ddp.py", j=f"2x{NPROC}",
            spares=plan.spares, recover=plan.recover, image=IMAGE, memMB=4096,
            env={"PYTHONPATH": "/opt/xrun:/venv-site"}, rdzv_conf=CONF, max_retries=30,
            mounts=[f"type=bind,src={out},dst=/out", f"type=bind,src={SITE},dst=/venv-site,readonly"],
        )  # fmt: skip
        app_id = self.sched.submit(app, {}, str(ws))
        role = app.roles[0].name
        self.names = [container_name(app_id, role, k) for k in range(2 + plan.spares)]
        self.pids = {}
        return app_id, out

    def follow(self, app_id: str, lines: Lines) -> None:
        for k, name in enumerate(self.names):
            p = subprocess.Popen(
                ["docker", "logs", "-f", name], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            self.procs.append(p)
            assert p.stdout is not None
            threading.Thread(target=_pump, args=(lines, k, p.stdout), daemon=True).start()

    def agent(self, app_id: str, k: int) -> int | None:
        name = self.names[k]
        if not self.pids.get(name):
            got = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", name],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            self.pids[name] = int(got.stdout.strip() or 0) if got.returncode == 0 else 0
        pid = self.pids[name]
        return _agent_under(pid) if pid > 0 else None

    def lose(self, app_id: str, k: int, agent: int) -> None:
        subprocess.run(
            ["docker", "kill", self.names[k]], check=True, capture_output=True, timeout=60
        )

    def end(self, app_id: str, timeout: float) -> str:
        from xrun.specs import is_terminal

        deadline = time.monotonic() + timeout
        while (resp := self.sched.describe(app_id)) is not None and not is_terminal(resp.state):
            if time.monotonic() > deadline:
                return f"still {resp.state.name} after {timeout:.0f} s"
            time.sleep(0.5)
        return "unknown" if resp is None else f"{resp.state.name} {resp.msg}".strip()

    def close(self, app_id: str) -> None:
        with contextlib.suppress(Exception):
            self.sched.cancel(app_id)
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


class Slurm:
    name = "slurm"

    def __init__(self) -> None:
        c.require_slurm()
        from xrun.schedulers.slurm import SlurmScheduler

        self.sched = SlurmScheduler("default")
        self.logs = Path()
        self.replicas = 0
        self.pids: dict[int, int] = {}

    def submit(self, plan: Plan, total: int, tmp: Path) -> tuple[str, Path]:
        from xrun.components.dist import ddp

        out = tmp / "out"
        out.mkdir()
        shutil.copy(TRAIN, tmp / "train_ddp.py")
        app = ddp(
            *_train_args(str(out), total), script="train_ddp.py", j=f"2x{NPROC}",
            spares=plan.spares, recover=plan.recover, cpu=1, memMB=1024,
            rdzv_port=c.free_port(), rdzv_conf=CONF, max_retries=30,
        )  # fmt: skip
        # Replica 0 serves the store, as on a real cluster (the first node is the endpoint's
        # host); here every node is this host and the first agent to bind would win.
        role = app.roles[0]
        conf = f"--rdzv-conf {CONF} "
        if conf not in role.args[1]:
            raise RunFailed(f"dist.ddp's command has no {conf.strip()!r}: {role.args[1][:200]}")
        is_host = '$(test "$XRUN_REPLICA_ID" = 0 && echo true || echo false)'
        role.args[1] = role.args[1].replace(conf, f"--rdzv-conf {CONF},is_host={is_host} ")
        app_id = self.sched.submit(app, {"exclusive": True}, workspace=str(tmp))
        self.logs = tmp / "slurm-logs" / app_id / role.name
        self.replicas, self.pids = 2 + plan.spares, {}
        return app_id, out

    def follow(self, app_id: str, lines: Lines) -> None:
        def poll() -> None:
            at: dict[Path, int] = {}
            rest: dict[Path, str] = {}
            while not lines.stop.is_set():
                for k in range(self.replicas):
                    for f in (self.logs / f"{k}.stdout", self.logs / f"{k}.stderr"):
                        try:
                            with f.open("rb") as fh:
                                fh.seek(at.get(f, 0))
                                data = fh.read()
                        except OSError:
                            continue
                        at[f] = at.get(f, 0) + len(data)
                        *done, rest[f] = (rest.get(f, "") + data.decode(errors="replace")).split(
                            "\n"
                        )
                        for line in done:
                            if line.strip():
                                lines.put(k, line)
                time.sleep(0.02)

        threading.Thread(target=poll, daemon=True).start()

    def agent(self, app_id: str, k: int) -> int | None:
        want = {"SLURM_JOB_ID": app_id, "XRUN_REPLICA_ID": str(k)}
        known = self.pids.get(k)  # a /proc scan per look would be CPU beside the timed job
        if known and want.items() <= _environ(known).items():
            return known
        for d in os.listdir("/proc"):
            if d.isdigit() and "xrun.runtime" in _cmdline(int(d)):
                if want.items() <= _environ(int(d)).items():
                    self.pids[k] = int(d)
                    return int(d)
        return None

    def lose(self, app_id: str, k: int, agent: int) -> None:
        os.killpg(os.getpgid(agent), signal.SIGKILL)

    def end(self, app_id: str, timeout: float) -> str:
        resp = self.sched.wait(app_id, timeout=timeout)
        return "unknown" if resp is None else f"{resp.state.name} {resp.msg}".strip()

    def close(self, app_id: str) -> None:
        with contextlib.suppress(Exception):
            self.sched.cancel(app_id)


BACKENDS: dict[str, Callable[[], Docker | Slurm]] = {"docker": Docker, "slurm": Slurm}


# --- one job, its faults -------------------------------------------------------------------------


@dataclass
class Done:
    """A job's faults (contender, seconds, steps lost), its end and final parameters."""

    faults: list[tuple[str, float, int]]
    end: str
    sha: str


def _wait_warm(be: Docker | Slurm, app_id: str, n: int, since: float, deadline: float) -> None:
    """Every live agent's pool full, and the job ``since`` old."""
    while True:
        agents = [a for k in range(n) if (a := be.agent(app_id, k))]
        short = [a for a in agents if ready(a) < NPROC]
        if not short and time.monotonic() >= since:
            return
        if time.monotonic() > deadline:
            raise RunFailed(f"{len(short)} agent(s)' warm pools not full after 300 s")
        time.sleep(0.2)


def run_job(be: Docker | Slurm, plan: Plan, total: int, rng: random.Random) -> Done:
    n = 2 + plan.spares
    with tempfile.TemporaryDirectory(prefix="xrun-bench-drill-") as tmp:
        app_id, out = be.submit(plan, total, Path(tmp))
        lines = Lines()
        try:
            be.follow(app_id, lines)
            lines.until(lambda ln: _STEP.search(ln) is not None, 900)
            since = time.monotonic()
            got: list[tuple[str, float, int]] = []
            for kind in plan.faults:
                for _ in range(rng.randint(5, 15)):
                    lines.until(lambda ln: _STEP.search(ln) is not None, 300)
                if plan.recover == "warm":
                    _wait_warm(be, app_id, n, since + plan.settle, time.monotonic() + 300)
                agents = {k: a for k in range(n) if (a := be.agent(app_id, k))}
                active = [k for k, a in agents.items() if workers(a)]
                # a worker: of a node without rank 0 (as measure 18); a node: not the store's
                # host (replica 0: its loss ends a c10d job), wherever rank 0 is
                victims = [k for k in active if (k != lines.rank0 if kind == WORKER else k != 0)]
                if len(active) != 2 or not victims:
                    raise RunFailed(f"active replicas {active}, rank 0 on {lines.rank0}: no victim")
                k = rng.choice(victims)
                if kind == NODE and not any(a for j, a in agents.items() if j not in active):
                    raise RunFailed("no spare is parked")
                pids = workers(agents[k])
                if kind == WORKER and len(pids) < NPROC:
                    raise RunFailed(f"replica {k} has {len(pids)} workers of {NPROC}")
                last = lines.last_step()
                if last >= total - 20:
                    raise RunFailed(f"the job was at step {last} of {total} before a fault")
                t0 = time.monotonic()
                try:
                    if kind == WORKER:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                    else:
                        be.lose(app_id, k, agents[k])
                except (OSError, subprocess.SubprocessError) as e:
                    raise RunFailed(f"the {kind} fault on replica {k} failed: {e}") from None
                lines.until(lambda ln: _STARTED.search(ln) is not None, 600)
                last = max(last, lines.step)  # a step printed before the kill, read since
                first = [last + 1]

                def step(ln: str, first: list[int] = first) -> bool:
                    if m := _STEP.search(ln):
                        first[0] = int(m[1])
                    return m is not None

                t1 = lines.until(step, 600)
                lost = max(0, last - (first[0] - 1))
                got.append((contender(be.name, kind, plan.recover), t1 - t0, lost))
                print(f"  {got[-1][0]}: {t1 - t0:.3f} s, {lost} steps lost (replica {k})",
                      file=sys.stderr)  # fmt: skip
            end = be.end(app_id, 900)
        finally:
            lines.stop.set()
            be.close(app_id)
        try:
            sha = str(json.loads((out / "out.json").read_text())["params_sha256"])
        except (OSError, ValueError, KeyError) as e:
            raise RunFailed(f"no result ({e}); the job ended {end}") from None
        return Done(got, end, sha)


def plans(backend: str, faults: int, smoke: bool) -> tuple[list[Plan], int]:
    """The jobs of one backend, round-robin (the reference run first), and their steps."""
    if smoke:  # one job, both faults of the subjects: the harness runs on both backends
        return [Plan(1, "warm", [WORKER, NODE], settle=10)], 600
    s = SPARES[backend]
    warm = [Plan(s, "warm", [WORKER, NODE] * s) for _ in range(-(-faults // s))]
    cold = min(faults, 5)
    out: list[Plan] = [Plan(0, "off")]
    for i in range(max(len(warm), 1)):
        out += warm[i : i + 1] + ([Plan(0, "off", [WORKER] * cold)] if i == 0 else [])
    # one length for every job of the backend (the undisturbed run's sha256 is for it): the
    # settle, then per fault the gap, a warm pool's refill (10-25 s at load) and the recovery
    return out, 400 + 150 * max(2 * s, cold)


# --- the measure ---------------------------------------------------------------------------------


def measure_21(reps: int, smoke: bool) -> list[Row]:
    faults = int(os.environ.get("XRUN_BENCH_DRILL_FAULTS", 1 if smoke else max(20, reps)))
    chosen = os.environ.get("XRUN_BENCH_DRILL_BACKENDS", ",".join(BACKENDS))
    rows: list[Row] = []
    for b in [x.strip() for x in chosen.split(",") if x.strip()]:
        if b not in BACKENDS:
            raise ValueError(f"XRUN_BENCH_DRILL_BACKENDS: {b!r}; expected among {list(BACKENDS)}")
        rows += _rows(b, faults, smoke)
    return rows


@dataclass
class Tally:
    """What the jobs of one backend gave, per contender."""

    names: list[str]
    results: dict[str, Stats | str] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    lost: dict[str, list[int]] = field(default_factory=dict)
    same: dict[str, list[bool]] = field(default_factory=dict)  # per job: bit-identical
    ref: str = ""  # the undisturbed run's sha256

    def run(self, be: Docker | Slurm, plan: Plan, total: int, rng: random.Random) -> None:
        these = sorted({contender(be.name, k, plan.recover) for k in plan.faults})
        if these and all(n in self.results for n in these):
            return  # these contenders failed already: the other kinds of job go on
        try:
            done = run_job(be, plan, total, rng)
            if not done.end.startswith("SUCCEEDED"):
                raise RunFailed(f"the job ended {done.end[:300]}")
        except RunFailed as e:
            why = f"failed: {e}" if these else f"failed: the undisturbed run: {e}"
            for n in these or self.names:
                self.results.setdefault(n, why)
            return
        if not plan.faults:
            self.ref = done.sha
        for n, secs, steps in done.faults:
            self.samples.setdefault(n, []).append(secs)
            self.lost.setdefault(n, []).append(steps)
        for n in these:
            self.same.setdefault(n, []).append(done.sha == self.ref)

    def exact(self, n: str) -> bool:
        return bool(self.same.get(n)) and all(self.same[n]) and not any(self.lost.get(n, []))

    def note(self, n: str) -> str:
        xs = self.samples.get(n, [])
        if not xs:
            return ""
        ident = f"{sum(self.same[n])} of {len(self.same[n])} jobs" if self.ref else "n/a"
        return (f"{n}: median {statistics.median(xs):.3f} s, p95 {_p95(xs):.3f} s, n={len(xs)}, "
                f"steps lost {sum(self.lost[n])} (max {max(self.lost[n])}), bit-identical {ident}")  # fmt: skip


def _rows(b: str, faults: int, smoke: bool) -> list[Row]:
    warm, spare, cold = (contender(b, WORKER, "warm"), contender(b, NODE, "warm"),
                         contender(b, WORKER, "off"))  # fmt: skip
    t = Tally([warm, spare] if smoke else [warm, spare, cold])
    try:
        be = BACKENDS[b]()
    except Unavailable as e:
        t.results = dict.fromkeys(t.names, f"unavailable: {e}")
    else:
        ps, total = plans(b, faults, smoke)
        rng = random.Random(21)
        for plan in ps:
            t.run(be, plan, total, rng)
    for n, xs in t.samples.items():
        t.results.setdefault(n, Stats(xs))

    def check(limit: float | None, ratio: float, subject: str) -> Callable[..., bool | None]:
        def ok(r: dict[str, Stats | str]) -> bool | None:
            s, ref_s = r.get(subject), r.get(cold)
            if not isinstance(s, Stats) or not isinstance(ref_s, Stats):
                return None
            fast = s.median <= ratio * ref_s.median and (limit is None or s.median <= limit)
            return fast and t.exact(subject)

        return ok

    def pick(*ns: str) -> dict[str, Stats | str]:
        return {n: t.results[n] for n in ns if n in t.results}

    job = f"a 2x{NPROC} gloo DDP job on {b}"
    return [
        Row(f"kill -9 of a worker of {job} -> first full-world step (issue #34)", "s",
            "warm <= 0.05x xrun's cold restart, 0 steps lost, bit-identical in every job",
            pick(warm, cold), subject=warm, reference=cold, check=check(None, 0.05, warm),
            note="; ".join(x for n in (warm, cold) if (x := t.note(n)))),
        Row(f"loss of a node of {job} + {1 if smoke else SPARES[b]} spare(s) -> first "
            "full-world step (issue #35)", "s",
            "spare warm <= 1 s median and <= 0.1x a worker's cold restart, 0 steps lost, "
            "bit-identical in every job",
            pick(spare, cold), subject=spare, reference=cold, check=check(1.0, 0.1, spare),
            note="; ".join(x for n in (spare, cold) if (x := t.note(n)))),
    ]  # fmt: skip
