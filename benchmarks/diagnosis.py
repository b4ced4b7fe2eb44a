"""Measure 15 (issue #24): does the first screen name the failed rank and the cause?

Each fault is injected into a 1x2 job (``workers/faults.py``: global rank 1 commits it while
rank 0 sleeps), under torchrun (``--standalone -t 3``, what xrun's ``dist.ddp`` passes too) and
under xrun (``xrun run -s local_cwd dist.ddp``, then ``xrun status``). A "screen" is what a
terminal of 24 lines shows: the last 24 lines of a launcher's output once it has ended, the
first 24 of ``xrun status``. It is a hit when the screen names rank 1 and the fault's cause
(one regular expression per fault) on one line, or in the summary's root-cause block (torchrun's
``rank : 1`` line there names the rank).

Docker and Slurm rows run xrun alone: the ``xrun-python`` image has no torch for torchrun, and on
Slurm the same torchrun output as on local would be counted again. The OOM faults run the
launcher inside a 1 GiB cgroup v1 memory cgroup made here (root needed: torchrun's own torch
import needs a few hundred MiB, so that the hog, not the launcher, is the OOM killer's choice): on docker the
container's own limit (``--memMB``), on Slurm a cgroup the replica enters before it execs the
agent (the test cluster has no cgroup plugin; see tests/schedulers/slurm/test_rootcause.py).

``python -m benchmarks.diagnosis`` runs it alone and prints the table.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import contenders as c
from benchmarks.harness import Row, Stats, Unavailable, interleave

SCREEN = 24
FAULTS_PY = c.WORKERS / "faults.py"
OUTSIDE = re.compile(r"from outside|kill -9")


@dataclass(frozen=True)
class Fault:
    name: str
    fault: str  # faults.py's FAULT
    cause: str  # what the screen must say, a regular expression
    env: Mapping[str, str] = field(default_factory=dict)
    outside: int = 0  # a signal sent to rank 1 from outside, once it is up
    cgroup: bool = False  # the launcher runs in a memory-limited cgroup
    where: str = "local"  # local | docker | slurm


FAULTS = (
    Fault("exception without @record", "raise", r"ValueError: bad shape in batch 7"),
    Fault("chained exception", "chained", r"RuntimeError: config has no learning rate"),
    Fault("exception with @record", "record", r"RuntimeError: recorded failure"),
    Fault("sys.exit(3)", "exit3", r"exited with code 3\b|exitcode\s*: 3\b"),
    Fault("os._exit(7)", "exit7", r"exited with code 7\b|exitcode\s*: 7\b"),
    Fault("segfault", "segv", r"SIGSEGV"),
    Fault("abort()", "abort", r"SIGABRT"),
    Fault("kill -9 from outside", "sleep", r"SIGKILL.*(from outside|kill -9)", outside=9),
    Fault("kill -TERM from outside", "sleep", r"SIGTERM.*from outside", outside=15),
    Fault("OOM under a memory cgroup", "oom", r"OOM killer|out of memory", cgroup=True),
    Fault(
        "a hang under torch's file timer",
        "expire",
        r"file timer",
        env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"},
    ),
    Fault(
        "a failing rank while the other ignores SIGTERM",
        "raise",
        r"ValueError: bad shape in batch 7",
        env={"FAULT_PEERS": "ignore-term", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"},
    ),
    Fault("exception without @record, docker", "raise", r"ValueError: bad shape", where="docker"),
    Fault("OOM under --memMB 256, docker", "oom", r"OOM killer", where="docker"),
    Fault("exception without @record, slurm", "raise", r"ValueError: bad shape", where="slurm"),
    Fault("OOM in a memory cgroup, slurm", "oom", r"OOM killer", cgroup=True, where="slurm"),
)
SMOKE = ("exception without @record", "kill -9 from outside")


def hit(screen: list[str], cause: str, rank: int = 1) -> bool:
    """Whether ``screen`` names ``rank`` and ``cause`` together."""
    pat = re.compile(cause)
    named = (f"rank {rank}", f"[default{rank}]", f"[{rank}]:", f"rank      : {rank} ")
    if any(pat.search(x) and any(n in x for n in named) for x in screen):
        return True
    text = "\n".join(screen)
    if "Root Cause (first observed failure):" not in text:
        return False
    root = text.split("Root Cause (first observed failure):")[1]
    return f"rank      : {rank} " in root and bool(pat.search(root))


# --------------------------------------------------------------------------- running one


@contextmanager
def _memory_cgroup(limit: int = 1 << 30) -> Iterator[Path]:
    """A cgroup v1 memory cgroup below this process's own, ``limit`` bytes with swap."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    rel = next((x.split(":", 2)[2] for x in lines if "memory" in x.split(":")[1].split(",")), "")
    top = Path("/sys/fs/cgroup/memory")
    if not rel or not top.is_dir() or not os.access(top, os.W_OK):
        raise Unavailable("needs a writable cgroup v1 memory controller (root)")
    cg = top / rel.lstrip("/") / f"xrun-bench-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        (cg / "memory.memsw.limit_in_bytes").write_text(str(limit))
        yield cg
    finally:
        # a launcher that lost to the OOM killer may leave workers behind: they go too
        deadline = time.monotonic() + 30
        while (pids := (cg / "cgroup.procs").read_text().split()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        cg.rmdir()


def _enter(cg: Path | None, argv: list[str]) -> list[str]:
    if cg is None:
        return argv
    return ["sh", "-c", f'echo $$ > {cg / "cgroup.procs"} && exec "$@"', "sh", *argv]


def _run(argv: list[str], f: Fault, cwd: str, timeout: float = 120) -> str:
    """Run ``argv`` (output merged), sending ``f.outside`` to rank 1 once its pid is known."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **c.BASE_ENV, **f.env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            if f.outside:
                pid_file = Path(cwd) / "pid.1"
                deadline = time.monotonic() + 60
                while not pid_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                os.kill(int(pid_file.read_text()), f.outside)
            p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out.seek(0)
        return out.read().decode(errors="replace")


def _out_dir(f: Fault, cwd: str) -> list[str]:
    """Where the workers write their pids: only where a test sends a signal from outside."""
    return [cwd] if f.outside else []


def _last(text: str) -> list[str]:
    return text.rstrip("\n").splitlines()[-SCREEN:]


def _torchrun(f: Fault) -> Callable[[], float]:
    def once() -> float:
        with tempfile.TemporaryDirectory(prefix="xrun-bench-") as cwd, _maybe_cgroup(f) as cg:
            argv = [c.tool("torchrun"), "--standalone", "--nproc-per-node", "2", "-t", "3"]
            argv += [str(FAULTS_PY), f.fault, "1", *_out_dir(f, cwd)]
            return float(hit(_last(_run(_enter(cg, argv), f, cwd)), f.cause))

    return once


def _xrun(f: Fault, screen: str) -> Callable[[], float]:
    """``screen``: "run" (the last lines of ``xrun run``) or "status" (``xrun status``)."""

    def once() -> float:
        with tempfile.TemporaryDirectory(prefix="xrun-bench-") as cwd, _maybe_cgroup(f) as cg:
            shutil.copy(FAULTS_PY, Path(cwd) / "faults.py")
            if f.where == "slurm":
                handle = _slurm_submit(f, cwd, cg)
                text = ""
            else:
                argv = [c.tool("xrun"), "run", "-s", f.where if f.where != "local" else "local_cwd"]
                if f.where == "docker":
                    argv += ["--wait", "dist.ddp", "--image", "xrun-python:latest"]
                    argv += ["--memMB", "256"] if f.fault == "oom" else []
                else:
                    argv += ["dist.ddp"]
                argv += ["-j", "1x2", "--script", "faults.py", f.fault, "1", *_out_dir(f, cwd)]
                text = _run(_enter(cg, argv), f, cwd)
                handle = next((w for w in text.split() if "://" in w and "/faults-" in w), "")
            if screen == "run":
                return float(hit(_last(text), f.cause))
            if not handle:
                return 0.0
            status = subprocess.run(
                [c.tool("xrun"), "status", handle], capture_output=True, text=True, timeout=60
            )
            return float(hit(status.stdout.splitlines()[:SCREEN], f.cause))

    return once


@contextmanager
def _maybe_cgroup(f: Fault) -> Iterator[Path | None]:
    if not f.cgroup:
        yield None
        return
    with _memory_cgroup() as cg:
        yield cg


def _slurm_submit(f: Fault, cwd: str, cg: Path | None) -> str:
    """Submit the fault as a 1x2 dist.ddp job on Slurm (its replica entering ``cg``); the
    handle once the job has ended."""
    from xrun.components.dist import ddp
    from xrun.schedulers.slurm import create_scheduler

    app = ddp(f.fault, "1", script="faults.py", j="1x2", cpu=1, rdzv_port=c.free_port())
    if cg is not None:
        role = app.roles[0]
        original = [role.entrypoint, *role.args]
        # "$$$$": role args go through the macro substitution, where "$$" is a literal "$"
        role.args = ["-c", f'echo $$$$ > {cg / "cgroup.procs"} && exec "$0" "$@"', *original]
        role.entrypoint = "sh"
    sched = create_scheduler("bench")
    try:
        app_id = sched.submit(app, {}, workspace=cwd)
        sched.wait(app_id, timeout=120)
    finally:
        sched.close()
    return f"slurm://default/{app_id}"


# --------------------------------------------------------------------------- the measure


def _row(f: Fault, reps: int, smoke: bool) -> Row:
    row = Row(
        f"{f.name}: the first screen names rank 1 and the cause",
        "hits",
        "xrun: every run",
        subject="xrun status",
        reference="torchrun",
        check=lambda r: _all_hits(r, ("xrun run", "xrun status")),
    )
    contenders: dict[str, Callable[[], float]] = {}
    if f.where == "local":
        contenders["torchrun"] = _torchrun(f)
    if f.where != "slurm":
        contenders["xrun run"] = _xrun(f, "run")
    contenders["xrun status"] = _xrun(f, "status")
    row.results = interleave(contenders, reps, warmup=False)
    if f.where != "local":
        row.results = {"torchrun": f"unavailable: {_why_no_torchrun(f)}", **row.results}
    return row


def _why_no_torchrun(f: Fault) -> str:
    if f.where == "docker":
        return "the xrun-python image has no torch"
    return "counted on the local rows (the same torchrun output)"


def _all_hits(results: Mapping[str, Stats | str], names: tuple[str, ...]) -> bool | None:
    got = [results[n] for n in names if n in results]
    if not got or not all(isinstance(s, Stats) for s in got):
        return None
    return all(min(s.samples) == 1.0 for s in got if isinstance(s, Stats))


def _total(results: Mapping[str, Stats | str], n: int) -> bool | None:
    s = results.get("xrun status")
    return s.median == n if isinstance(s, Stats) else None


def measure_15(reps: int, smoke: bool) -> list[Row]:
    faults = [f for f in FAULTS if not smoke or f.name in SMOKE]
    reps = 1 if smoke else min(reps, 3)  # each run is a whole job; hits hardly vary
    rows = [_row(f, reps, smoke) for f in faults]
    total = Row(
        f"all {len(rows)} faults: runs whose first screen names rank 1 and the cause",
        "hits",
        "xrun status: all",
        subject="xrun status",
        reference="torchrun",
        note="per contender: the sum over the faults it ran (torchrun: local faults only)",
        check=lambda r, n=len(rows): _total(r, n),
    )
    for name in ("torchrun", "xrun run", "xrun status"):
        sums = [r.results[name] for r in rows if isinstance(r.results.get(name), Stats)]
        if sums:
            total.results[name] = Stats([sum(s.median for s in sums if isinstance(s, Stats))])
    rows.append(total)
    return rows


if __name__ == "__main__":
    import sys

    from benchmarks.harness import render

    print(render({"15": ("fault diagnosis (issue #24)", measure_15(1, "--smoke" in sys.argv))}))
    sys.exit(0)
