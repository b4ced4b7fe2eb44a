"""The backends of measure 21 (benchmarks/drills.py): a job submitted through the docker or
slurm scheduler, its replicas' output lines as they come, its agents and workers found in
/proc (both backends run on this host), and the loss of a node."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks import contenders as c
from benchmarks.harness import RunFailed, Unavailable
from benchmarks.recovery import _STARTED, _STEP, TRAIN, _children, _comm

if TYPE_CHECKING:
    from benchmarks.drills import Plan

NPROC = 2
STEP_SLEEP = 0.1  # issue #34's steps
CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout=300"
SITE = sysconfig.get_paths()["purelib"]  # torch, for the containers' python3 (3.11 both)
IMAGE = "xrun-python:latest"
ETCD = "127.0.0.1:2379"  # scripts/etcd-server.sh's; the slurm nodes are this host
ETCD_CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=300"


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


def _is_agent(pid: int) -> bool:
    """``python3 -m xrun.runtime ...`` itself, not a shell or docker-init whose command line
    holds those words."""
    argv = _cmdline(pid).split()
    return (
        len(argv) >= 3
        and os.path.basename(argv[0]).startswith("python")
        and argv[1:3] == ["-m", "xrun.runtime"]
    )


def _agent_under(pid: int) -> int | None:
    todo = [pid]
    while todo:
        p = todo.pop()
        if _is_agent(p):
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
        if plan.etcd:  # any node can be lost: the rendezvous is in etcd (etcd_spares.py)
            app = ddp(
                *_train_args(str(out), total), script="train_ddp.py", j=f"2x{NPROC}",
                spares=plan.spares, recover=plan.recover, cpu=1, memMB=1024, max_retries=30,
                rdzv_backend="etcd", rdzv_endpoint=ETCD,
                rdzv_conf=f"{ETCD_CONF},etcd_prefix=/xrun-bench/{tmp.name}",
            )  # fmt: skip
            app_id = self.sched.submit(app, {"exclusive": True}, workspace=str(tmp))
            self.logs = tmp / "slurm-logs" / app_id / app.roles[0].name
            self.replicas, self.pids = 2 + plan.spares, {}
            return app_id, out
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
            if d.isdigit() and _is_agent(int(d)):
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
