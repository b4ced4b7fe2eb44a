"""Measure 18: a recovery drill (issue #34). A 1x4 gloo DDP job (steps of 0.1 s) loses one
worker to ``kill -9`` at a random step; the figure is the time from the kill to the first
full-world step after it (rank 0's ``step S`` line: a DDP step completes only when every rank
took part), for xrun's agent with ``--recover warm`` and ``--recover off`` (cold: today's
restart) and torchrun ``--max-restarts``, side by side in one run, round-robin.

The job is ``examples/train_ddp.py --print-steps`` when that flag exists, else
``benchmarks/workers/ddp_steps.py`` (the same kind of loop, its own lines). Each run takes
``faults`` kills, one per attempt (``--max-restarts faults``); before a kill under ``warm`` the
driver waits for the agent's pool to be full (its ready marks) and the job to be 30 s old (the
pool has imported the modules of the first steps), so every fault meets the state a long job
is in. A contender whose job does not come back (torchrun's gloo restarts may fail
``connectFullMesh``) is reported as failed with its reason, not dropped silently.
"""

from __future__ import annotations

import glob
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, Unavailable

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_ddp.py"
STEPS = c.WORKERS / "ddp_steps.py"
NPROC = 4
_STARTED = re.compile(r"rank 0/\d+: started \(restart (\d+)\)")
_STEP = re.compile(r"\bstep (\d+)\s*$")


def _script(tmp: str) -> list[str]:
    if TRAIN.exists() and "--print-steps" in TRAIN.read_text():
        return [str(TRAIN), "--print-steps", "--step-sleep", "0.1", "--epochs", "1000",
                "--steps-per-epoch", "1000", "--checkpoint-dir", os.path.join(tmp, "ckpt")]  # fmt: skip
    return [str(STEPS)]


def _children(pid: int) -> list[int]:
    out = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            out += [int(x) for x in Path(task).read_text().split()]
        except OSError:
            pass
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ready(agent: int) -> int:
    """The agent's warm interpreters that are ready (their marks in the pool's folder)."""
    kids = set(_children(agent))
    marks = glob.glob(os.path.join(tempfile.gettempdir(), "xrun-warm-*", "ready.*"))
    return sum(int(m.rsplit(".", 1)[1]) in kids for m in marks)


class _Job:
    """A launcher run whose output lines are read, timestamped, by a thread."""

    def __init__(self, cmd: list[str], cwd: str) -> None:
        env = {**os.environ, **c.BASE_ENV}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, cwd=cwd, env=env, start_new_session=True,
        )  # fmt: skip
        self.started = time.monotonic()
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.tail: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))
            self.tail = [*self.tail[-40:], line.rstrip("\n")]
        self.lines.put((time.monotonic(), ""))

    def until(self, match: Callable[[str], bool], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            try:
                t, line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RunFailed(f"timed out; last lines: {' | '.join(self.tail[-4:])}") from None
            if line == "":  # the output ended: so did the job, or it will at once
                code = self.proc.wait(timeout=60)
                raise RunFailed(f"the job ended ({code}): {' | '.join(self.tail[-3:])}")
            if match(line):
                return t

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # the launcher stops its workers
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _drill(cmd: list[str], faults: int, warm: bool, rng: random.Random) -> list[float]:
    """Run ``cmd`` and kill one worker ``faults`` times; the seconds to recover from each."""
    samples = []
    with tempfile.TemporaryDirectory(prefix="xrun-bench-drill-") as tmp:
        job = _Job([*cmd, *_script(tmp)], tmp)
        try:
            for f in range(faults):
                job.until(lambda ln, f=f: (m := _STARTED.search(ln)) is not None and int(m[1]) == f, 600)  # fmt: skip
                for _ in range(rng.randint(5, 15)):
                    job.until(lambda ln: _STEP.search(ln) is not None, 120)
                # warm: a full pool that had time to import the first steps' modules (the
                # workers report them in their first 90 s), as in any job past its start
                deadline = time.monotonic() + 300
                settled = job.started + 30
                while (
                    warm
                    and time.monotonic() < deadline
                    and (_ready(job.proc.pid) < NPROC or time.monotonic() < settled)
                ):
                    time.sleep(0.1)
                workers = [k for k in _children(job.proc.pid) if _comm(k) != "xrun-warm"]
                if len(workers) < NPROC:
                    raise RunFailed(f"found {len(workers)} workers of {NPROC}")
                while not job.lines.empty():  # the steps before the kill are read
                    job.lines.get_nowait()
                t0 = time.monotonic()
                os.kill(rng.choice(workers), signal.SIGKILL)
                job.until(lambda ln, f=f: (m := _STARTED.search(ln)) is not None and int(m[1]) == f + 1, 600)  # fmt: skip
                # the restarted rank 0's start line was read: its next step is the world's
                t1 = job.until(lambda ln: _STEP.search(ln) is not None, 600)
                samples.append(t1 - t0)
                print(f"  {' '.join(cmd[-6:])}: fault {f + 1}: {t1 - t0:.3f} s", file=sys.stderr)
                # put the start line back for the next round's wait
                job.lines.put((t1, f"rank 0/{NPROC}: started (restart {f + 1})"))
        finally:
            job.stop()
    return samples


def _p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def _check(results: Mapping[str, Stats | str]) -> bool | None:
    warm, off = results.get("xrun-agent warm"), results.get("xrun-agent off")
    if not isinstance(warm, Stats) or not isinstance(off, Stats):
        return None
    return warm.median <= 0.5 and warm.median <= 0.05 * off.median


def measure_18(reps: int, smoke: bool) -> list[Row]:
    faults = 1 if smoke else 4  # smoke: one of each (a cold one costs ~20 s at load)
    rng = random.Random(34)
    agent = [c.PYTHON, "-m", "xrun.runtime", "--standalone", "--nproc-per-node", str(NPROC),
             "--max-restarts", str(faults), "--tee", "3"]  # fmt: skip
    try:
        torchrun = [c.tool("torchrun"), "--standalone", "--nproc-per-node", str(NPROC),
                    "--max-restarts", str(faults), "--tee", "3"]  # fmt: skip
    except Unavailable as e:
        torchrun = []
        torchrun_why = str(e)
    contenders: dict[str, tuple[list[str], bool]] = {
        "xrun-agent warm": ([*agent, "--recover", "warm"], True),
        "xrun-agent off": ([*agent, "--recover", "off"], False),
        "torchrun": (torchrun, False),
    }
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    results: dict[str, Stats | str] = {}
    if not torchrun:
        results["torchrun"] = f"unavailable: {torchrun_why}"
    for _ in range(reps):
        for name, (cmd, warm) in contenders.items():
            if name in results:
                continue
            try:
                samples[name] += _drill(cmd, faults, warm, rng)
            except RunFailed as e:
                results[name] = f"failed: {e}"
    note = []
    for name, xs in samples.items():
        if name not in results and xs:
            results[name] = Stats(xs)
        if xs:
            note.append(
                f"{name}: median {statistics.median(xs):.3f} s, p95 {_p95(xs):.3f} s, n={len(xs)}"
            )
    row = Row(
        f"kill -9 of one worker -> first full-world step, 1x4 gloo DDP ({_script('')[0].rsplit('/', 1)[-1]})",
        "s",
        "warm <= 0.5 s and <= 0.05x cold (xrun-agent off)",
        results,
        subject="xrun-agent warm",
        reference="xrun-agent off",
        check=_check,
        note="; ".join(note),
    )
    return [row]
