"""How each contender launches the same job: the command lines and the timed run.

A ``Job`` says what to run (a worker script from ``benchmarks/workers``, nodes x workers,
restarts, tee); ``floor``, ``torchrun``, ``agent`` (``python -m xrun.runtime``), ``xrun`` (the
CLI on local_cwd) and ``torchx`` turn it into processes. ``timed`` starts them together and
returns the wall time until the last one exits, raising ``RunFailed`` on a non-zero exit so
that a broken launcher never produces a figure.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from benchmarks.harness import RunFailed, Unavailable, one_line

WORKERS = Path(__file__).resolve().parent / "workers"
PYTHON = sys.executable
# Every contender's workers get it: torchrun sets it for >1 worker anyway (and warns when it
# has to), the floor would otherwise let four torch imports each start one thread per core.
BASE_ENV = {"OMP_NUM_THREADS": "1"}
# xrun's own folders (src/xrun links to the other three; compileall skips the links).
XRUN_SOURCES = ("src/xrun", "components", "schedulers", "runtime")


def ensure_bytecode() -> None:
    """Byte-compile xrun's modules, as ``pip install`` does for an installed package.

    torch's modules come with their .pyc from pip; an editable checkout run with
    PYTHONDONTWRITEBYTECODE=1 (as this project's scripts do) would otherwise compile every xrun
    module from source in every process (~45 ms per agent start, measured with cProfile), which
    no installed xrun pays. The .pyc files go to the usual ``__pycache__`` folders (git-ignored).
    """
    import compileall

    root = WORKERS.parent.parent
    for folder in XRUN_SOURCES:
        if (root / folder).is_dir():
            compileall.compile_dir(str(root / folder), quiet=2, workers=1)


Cmd = tuple[list[str], dict[str, str]]


@dataclass(frozen=True)
class Job:
    script: str  # file name under benchmarks/workers
    args: tuple[str, ...] = ()
    nnodes: int = 1
    nproc: int = 4
    max_restarts: int = 0
    tee: str | None = None  # torchrun's -t value, e.g. "3"
    log_dir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return str(WORKERS / self.script)


def tool(name: str) -> str:
    """A console script installed beside this interpreter (the venv's ``bin``)."""
    path = Path(PYTHON).parent / name
    if not path.exists():
        raise Unavailable(f"{name} is not installed in {path.parent}")
    return str(path)


def require_slurm() -> None:
    """Unavailable unless a Slurm cluster answers here (the suite's script starts one)."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        raise Unavailable("no Slurm here (scripts/slurm-cluster.sh up starts a test cluster)")
    if subprocess.run(["squeue", "-h"], capture_output=True, timeout=60).returncode != 0:
        raise Unavailable("squeue does not answer (scripts/slurm-cluster.sh up)")


def etcd_up() -> bool:
    """Whether the suite's etcd answers on 127.0.0.1:2379, started by scripts/etcd-server.sh
    (idempotent) if it did not."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "etcd-server.sh"
    return (
        subprocess.run(["bash", str(script), "up"], capture_output=True, timeout=600).returncode
        == 0
    )


def free_port() -> int:
    # Bind port 0 and release it: a small race with other programs, acceptable for benchmarks.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def floor(job: Job) -> list[Cmd]:
    """The workers alone, spawned directly with the env a launcher would give them."""
    port = free_port()
    world = job.nnodes * job.nproc
    cmds: list[Cmd] = []
    for rank in range(world):
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % job.nproc),
            "GROUP_RANK": str(rank // job.nproc),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(job.nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0",
        }
        cmds.append(([PYTHON, "-u", job.path, *job.args], env))
    return cmds


def _launcher_cmds(prefix: list[str], job: Job) -> list[Cmd]:
    """torchrun-style agents: one standalone agent, or one per node meeting over c10d."""
    common = ["--nproc-per-node", str(job.nproc), "--max-restarts", str(job.max_restarts)]
    if job.tee is not None:
        common += ["-t", job.tee]
    if job.log_dir is not None:
        common += ["--log-dir", job.log_dir]
    tail = [job.path, *job.args]
    if job.nnodes == 1:
        return [([*prefix, "--standalone", *common, *tail], {})]
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    return [
        (
            [
                *prefix,
                "--nnodes",
                str(job.nnodes),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                run_id,
                *common,
                *tail,
            ],
            {},
        )
        for _ in range(job.nnodes)
    ]


def torchrun(job: Job) -> list[Cmd]:
    return _launcher_cmds([tool("torchrun")], job)


def agent(job: Job) -> list[Cmd]:
    """xrun's agent on its own (no CLI, no scheduler): ``python -m xrun.runtime``."""
    if importlib.util.find_spec("xrun.runtime.agent") is None:
        raise Unavailable("xrun.runtime.agent is not built yet")
    return _launcher_cmds([PYTHON, "-m", "xrun.runtime"], job)


def _component_cmd(exe: str, job: Job, *run_opts: str) -> list[Cmd]:
    cmd = [exe, "run", *run_opts, "-s", "local_cwd", "dist.ddp", "-j", f"{job.nnodes}x{job.nproc}"]
    if job.max_restarts:
        cmd += ["--max_retries", str(job.max_restarts)]
    if job.nnodes > 1:  # the default port (29500) would clash with any other job on this host
        cmd += ["--rdzv_port", str(free_port())]
    cmd += ["--script", job.path]
    if job.args:
        cmd += ["--", *job.args]
    return [(cmd, {"XDG_STATE_HOME": _state_dir()})]


def _state_dir() -> str:
    """One private state dir per benchmark process for the local_cwd app index and logs, so
    runs neither pile up in the user's ~/.local/state nor see the user's other apps."""
    global _STATE
    if _STATE is None:
        _STATE = tempfile.mkdtemp(prefix="xrun-bench-state-")
        atexit.register(shutil.rmtree, _STATE, True)
    return _STATE


_STATE: str | None = None


def xrun(job: Job) -> list[Cmd]:
    """The whole product: ``xrun run -s local_cwd dist.ddp -j NxM --script ...``."""
    if (
        importlib.util.find_spec("xrun.cli") is None
        or importlib.util.find_spec("xrun.schedulers.local_cwd") is None
    ):
        raise Unavailable("the xrun CLI or its local_cwd scheduler is not built yet")
    return _component_cmd(tool("xrun"), job, "--wait")


def torchx(job: Job) -> list[Cmd]:
    if importlib.util.find_spec("torchx") is None:
        raise Unavailable("torchx is not installed (optional)")
    return _component_cmd(tool("torchx"), job)


def _tail(err: IO[bytes], size: int = 1500) -> str:
    err.seek(0, os.SEEK_END)
    err.seek(max(0, err.tell() - size))
    return one_line(err.read().decode(errors="replace"))


def timed(
    cmds: Sequence[Cmd],
    *,
    cwd: str | None = None,
    stdout: int | str | None = None,
    timeout: float = 300.0,
    expect_rc: int = 0,
) -> float:
    """Start every command at once; the seconds until the last exits.

    ``stdout``: None -> /dev/null, a path -> that file (shared by all), an fd -> it.
    Each process's stderr goes to its own temp file, quoted in ``RunFailed`` when it fails.
    """
    own_cwd = None
    if cwd is None:
        own_cwd = tempfile.TemporaryDirectory(prefix="xrun-bench-")
        cwd = own_cwd.name
    out_file = None
    if isinstance(stdout, str):
        out_file = open(stdout, "wb")  # noqa: SIM115 - closed below, after the processes
        out_fd = out_file.fileno()
    else:
        out_fd = subprocess.DEVNULL if stdout is None else stdout
    errs = [tempfile.TemporaryFile() for _ in cmds]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        t0 = time.perf_counter()
        for (argv, env), err in zip(cmds, errs, strict=True):
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env={**os.environ, **BASE_ENV, **env},
                    stdout=out_fd,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                )
            )
        deadline = t0 + timeout
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.perf_counter()))
        elapsed = time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        # What each process said so far: a hang that happens once in CI is diagnosed from this.
        said = "; ".join(f"[{i}] {_tail(e)}" for i, e in enumerate(errs))
        raise RunFailed(f"{cmds[0][0][:3]} ran past {timeout:.0f} s; stderr: {said}") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if out_file is not None:
            out_file.close()
        if own_cwd is not None:
            own_cwd.cleanup()
    bad = [(p, e) for p, e in zip(procs, errs, strict=True) if p.returncode != expect_rc]
    if bad:
        p, err = bad[0]
        argv = [str(a) for a in cmds[procs.index(p)][0]]
        err.seek(0)
        tail = err.read()[-1500:].decode(errors="replace")
        for e in errs:
            e.close()
        raise RunFailed(
            f"{' '.join(argv[:6])} ... exited {p.returncode} "
            f"(expected {expect_rc}): {one_line(tail)}"
        )
    for e in errs:
        e.close()
    return elapsed
