"""Measure 18's torchft contender (issue #34): the same kill -9 drill under torchft 0.2.0.

torchft is installed by this module into a venv of its own (``torchft_python``; never the
project's dependencies): the project's venv (torch 2.13.0 CPU, xrun) shows through a .pth file
and a constraint file pins torch to the version already there, so pip never fetches another.

The job (workers/torchft_train.py: examples/train_ddp.py's model, data and SGD, steps of 0.1 s)
runs as two replica groups of two ranks, each its own torchrun with ``--max-restarts`` (torchft's
torchx component ``torchft.torchx.hsdp`` launches groups so: that is its in-place relaunch),
and torchft's lighthouse on 127.0.0.1 with the flags its README gives (``--min_replicas 1
--quorum_tick_ms 100 --join_timeout_ms 10000``). Each fault: a few full steps, then kill -9 of
a worker of group 1 (group 0 holds rank 0, whose lines are read). Its torchrun restarts the
group; the group's new managers join the lighthouse's quorum and heal from group 0 (torchft's
live recovery: the parameters and optimizer state of the healthy group's current step, over
HTTP). Meanwhile group 0 trains on alone, on half the data.

Figures: seconds from the kill to the first step committed with both replica groups in the
quorum (rank 0's ``step S`` line, printed when ``Manager.num_participants()`` equals the
number of groups); steps lost (rank 0's last step before the kill + 1 minus its first step
after it: steps redone, 0 by design); the steps rank 0 committed with one group only (half the
data of those steps was never trained). ``params_check``: a fixed run of ``steps`` with one
kill against the same run undisturbed and against examples/train_ddp.py's 1x4 (the xrun agent,
no fault): torchft's two-level average (group, then groups) sums in another order than DDP's,
and a faulted run trains steps on half the data, so bit-identity is not expected; the note
says what was found.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import contenders as c
from benchmarks.harness import RunFailed, one_line, peer_venv
from benchmarks.recovery import _STEP, _children, _Job

TORCHFT = "torchft==0.2.0"
VENV = Path(os.environ.get("XRUN_BENCH_TORCHFT_VENV", "/var/tmp/xrun-bench-torchft"))
WORKER = c.WORKERS / "torchft_train.py"
TRAIN = c.WORKERS.parent.parent / "examples" / "train_ddp.py"
GROUPS, PER_GROUP = 2, 2
LIGHTHOUSE = ["--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000"]
_ANY_STEP = re.compile(r"^step (\d+)")  # full-world or not
_GROUP_START = re.compile(r"rank ([1-9]\d*)/\d+: started \(restart (\d+)\)")
_SHA = re.compile(r"params sha256 ([0-9a-f]{64})")


def torchft_python() -> str:
    """A venv of the benchmark's own with torchft 0.2.0 over the project's torch
    (``harness.peer_venv``; the constraint keeps the project's torch: no multi-GB wheel). Made
    once (~30 s); raises Unavailable when pip cannot get it or it does not import."""
    probe = "import torchft, torch.distributed.run; from torchft import Manager, ProcessGroupGloo"
    pin = f"torch=={importlib.metadata.version('torch')}\n"
    return peer_venv(VENV, TORCHFT, [TORCHFT], probe, needs=["torchft_lighthouse"],
                     constraints=pin, timeout=900)  # fmt: skip


def _workers(torchrun: int) -> list[int]:
    """The group's workers: torchrun's children that run the worker script."""
    out = []
    for pid in _children(torchrun):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if WORKER.name.encode() in cmd:
            out.append(pid)
    return out


class _Run:
    """The lighthouse and one torchrun per replica group; the lines of all in one queue."""

    def __init__(self, tmp: str, restarts: int, args: list[str]) -> None:
        py = torchft_python()
        port = c.free_port()
        self.log = open(os.path.join(tmp, "lighthouse.log"), "w")  # noqa: SIM115
        self.lighthouse = subprocess.Popen(
            [str(VENV / "bin" / "torchft_lighthouse"), *LIGHTHOUSE, "--bind", f"127.0.0.1:{port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        lines: queue.Queue[tuple[float, str]] = queue.Queue()
        env = {"TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}", "PYTHONUNBUFFERED": "1",
               "NUM_REPLICA_GROUPS": str(GROUPS), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # fmt: skip
        self.jobs = [
            _Job([py, "-m", "torch.distributed.run", f"--master-port={c.free_port()}",
                  "--nnodes=1", f"--nproc-per-node={PER_GROUP}", f"--max-restarts={restarts}",
                  "--redirects=2", f"--log-dir={tempfile.mkdtemp(prefix=f'logs-{g}-', dir=tmp)}",
                  str(WORKER), "--full-start", *args],
                 tmp, lines, env={**env, "REPLICA_GROUP_ID": str(g)})
            for g in range(GROUPS)
        ]  # fmt: skip
        self.job = self.jobs[0]  # holds rank 0: reads every group's lines

    def kill_one(self, rng: random.Random) -> float:
        """kill -9 of a worker of group 1; the time of the kill."""
        workers = _workers(self.jobs[1].proc.pid)
        if len(workers) < PER_GROUP:
            raise RunFailed(f"found {len(workers)} workers of {PER_GROUP} in group 1")
        t0 = time.monotonic()
        os.kill(rng.choice(workers), signal.SIGKILL)
        return t0

    def stop(self) -> None:
        for j in self.jobs:
            j.stop()
        self.lighthouse.terminate()
        try:
            self.lighthouse.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.lighthouse.kill()
            self.lighthouse.wait()
        self.log.close()


class Drill:
    """measure_18's torchft contender: ``drill(faults, rng)`` -> (seconds, steps lost) per
    fault; ``half`` collects the steps committed with one group per fault, for the note."""

    def __init__(self) -> None:
        self.half: list[int] = []

    def __call__(self, faults: int, rng: random.Random) -> tuple[list[float], list[int]]:
        samples, lost = [], []
        with tempfile.TemporaryDirectory(prefix="xrun-bench-torchft-") as tmp:
            run = _Run(tmp, faults, ["--step-sleep", "0.1"])
            job = run.job
            try:
                for f in range(faults):
                    for _ in range(rng.randint(5, 15)):
                        job.until(lambda ln: _STEP.search(ln) is not None, 600 if f == 0 else 120)
                    last = -1
                    while not job.lines.empty():  # the steps before the kill are read
                        if m := _ANY_STEP.search(job.lines.get_nowait()[1]):
                            last = int(m[1])
                    t0 = run.kill_one(rng)
                    seen: dict[str, int] = {"first": -1, "half": 0, "back": 0}

                    def full(ln: str, seen: dict[str, int] = seen, f: int = f) -> bool:
                        if (m := _GROUP_START.search(ln)) and int(m[2]) > f:
                            seen["back"] = 1  # group 1 was relaunched: the old one is gone
                        if m := _ANY_STEP.search(ln):
                            seen["first"] = int(m[1]) if seen["first"] < 0 else seen["first"]
                            seen["half"] += _STEP.search(ln) is None
                        return bool(seen["back"]) and _STEP.search(ln) is not None

                    t1 = job.until(full, 600)
                    samples.append(t1 - t0)
                    lost.append(max(0, last + 1 - seen["first"]) if last >= 0 else 0)
                    self.half.append(seen["half"])
                    print(f"  torchft: fault {f + 1}: {t1 - t0:.3f} s, {lost[-1]} steps lost, "
                          f"{seen['half']} steps with one group", file=sys.stderr)  # fmt: skip
            finally:
                run.stop()
        return samples, lost

    def notes(self, result: object, rng: random.Random) -> list[str]:
        """The row's note: the steps with one group, and the final parameters' check."""
        if not self.half:
            return []
        out = [f"torchft: steps rank 0 committed with one replica group of two (half the "
               f"data) {sum(self.half)} in all (max {max(self.half)})"]  # fmt: skip
        try:
            out.append(params_check(60, rng))
        except RunFailed as e:
            out.append(f"torchft params check failed: {e}")
        return out


def _finish(run: _Run, timeout: float) -> str:
    """Wait for both groups to end; rank 0's final parameters' sha256."""
    sha, ended = "", 0
    try:
        while ended < len(run.jobs):  # each job's reader puts "" at the end of its output
            ln = run.job.lines.get(timeout=timeout)[1]
            ended += ln == ""
            if m := _SHA.search(ln):
                sha = sha or m[1]
    except queue.Empty:
        raise RunFailed(f"torchft run timed out: {' | '.join(run.job.tail[-3:])}") from None
    codes = [j.proc.wait() for j in run.jobs]
    if any(codes) or not sha:
        raise RunFailed(f"torchft run ended {codes}: {' | '.join(run.job.tail[-3:])}")
    return sha


def params_check(steps: int, rng: random.Random) -> str:
    """One line for the note: the final parameters of a fixed run of ``steps`` with one kill,
    undisturbed, and examples/train_ddp.py's 1x4 (xrun agent, no fault)."""
    shas: dict[str, str] = {}
    args = ["--steps", str(steps), "--steps-per-epoch", str(steps), "--step-sleep", "0.1"]
    with tempfile.TemporaryDirectory(prefix="xrun-bench-torchft-") as tmp:
        for name in ("undisturbed", "one kill"):
            run = _Run(tmp, 1, args)
            try:
                if name == "one kill":
                    at = rng.randint(5, steps // 2)

                    def reached(ln: str, at: int = at) -> bool:
                        return bool((m := _STEP.search(ln)) and int(m[1]) >= at)

                    run.job.until(reached, 600)
                    run.kill_one(rng)
                shas[name] = _finish(run, 600)
            finally:
                run.stop()
        out = os.path.join(tmp, "ref.json")
        ref = subprocess.run(
            [c.PYTHON, "-m", "xrun.runtime", "--standalone", "--nproc-per-node", "4",
             str(TRAIN), "--epochs", "1", "--steps-per-epoch", str(steps), "--checkpoint-dir",
             os.path.join(tmp, "ckpt"), "--out", out],
            capture_output=True, text=True, timeout=900, cwd=tmp, env={**os.environ, **c.BASE_ENV},
        )  # fmt: skip
        if ref.returncode:
            raise RunFailed(f"train_ddp reference failed: {one_line(ref.stderr)}")
        shas["train_ddp"] = json.loads(Path(out).read_text())["params_sha256"]
    same = {k: shas[k] == shas["train_ddp"] for k in ("undisturbed", "one kill")}
    return (f"torchft final params after {steps} steps vs train_ddp 1x4 undisturbed: "
            f"torchft undisturbed {'bit-identical' if same['undisturbed'] else 'differ'}, "
            f"with one kill {'bit-identical' if same['one kill'] else 'differ'} "
            f"(torchft undisturbed vs one kill: "
            f"{'same' if shas['undisturbed'] == shas['one kill'] else 'differ'})")  # fmt: skip
