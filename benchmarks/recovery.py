"""Measure 18: a recovery drill (issue #34). A 1x4 gloo DDP job (steps of 0.1 s) loses one
worker to ``kill -9`` at a random step; the figure is the time from the kill to the first
full-world step after it (rank 0's ``step S`` line: a DDP step completes only when every rank
took part), for xrun's agent with ``--recover warm`` and ``--recover off`` (cold: today's
restart) and torchrun ``--max-restarts``, side by side in one run, round-robin. A second row:
the same job as 2x2 (two agents on this host, c10d rendezvous), a worker of the node without
rank 0 killed, ``--recover warm`` and ``off``. Each row's note adds the steps lost (the last
step rank 0 printed before the kill minus the step the ranks resumed after).

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
from benchmarks import ftl
from benchmarks.harness import Row, RunFailed, Stats, Unavailable

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_ddp.py"
STEPS = c.WORKERS / "ddp_steps.py"
NPROC = 4
_STARTED = re.compile(r"rank 0/\d+: started \(restart (\d+)\)")
_RESUMED = re.compile(r"resuming after (step|epoch) (\d+)")
SPE = 1000  # the script's steps per epoch
_STEP = re.compile(r"\bstep (\d+)\s*$")


def _script(tmp: str) -> list[str]:
    if TRAIN.exists() and "--print-steps" in TRAIN.read_text():
        return [str(TRAIN), "--print-steps", "--step-sleep", "0.1", "--epochs", "1000",
                "--steps-per-epoch", str(SPE), "--checkpoint-dir", os.path.join(tmp, "ckpt")]  # fmt: skip
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


def _workers(launcher: int) -> list[int]:
    """The launcher's workers: not xrun's warm interpreters, nor ft_launcher's rank monitors
    (forks of it, named as it is)."""
    return [k for k in _children(launcher) if _comm(k) not in ("xrun-warm", "ft_launcher")]


def _ready(agent: int) -> int:
    """The agent's warm interpreters that are ready (their marks in the pool's folder)."""
    kids = set(_children(agent))
    marks = glob.glob(os.path.join(tempfile.gettempdir(), "xrun-warm-*", "ready.*"))
    return sum(int(m.rsplit(".", 1)[1]) in kids for m in marks)


class _Job:
    """A launcher run whose output lines are read, timestamped, by a thread (into ``lines``:
    the nodes of one job share one queue, whichever holds rank 0)."""

    def __init__(
        self,
        cmd: list[str],
        cwd: str,
        lines: queue.Queue[tuple[float, str]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = {**os.environ, **c.BASE_ENV, **(env or {})}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, cwd=cwd, env=env, start_new_session=True,
        )  # fmt: skip
        self.started = time.monotonic()
        self.lines: queue.Queue[tuple[float, str]] = lines or queue.Queue()
        self.tail: list[str] = []
        self.rank0 = False  # rank 0 runs here (its start line came from this launcher)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.strip():  # "" is the end marker below (ft_launcher prints blank lines)
                continue
            self.rank0 = self.rank0 or _STARTED.search(line) is not None
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


def _drill(
    cmds: list[list[str]], faults: int, warm: bool, rng: random.Random, settle: float = 30
) -> tuple[list[float], list[int]]:
    """Run one agent per command in ``cmds`` (the nodes of one job) and kill one worker of a
    node that does not run rank 0 (a second node) ``faults`` times: the seconds to recover from
    each, and the steps each lost (the last step rank 0 printed before the kill minus the step
    the ranks resumed after; 0 when nothing was redone)."""
    samples, lost = [], []
    per_node = NPROC // len(cmds)
    with tempfile.TemporaryDirectory(prefix="xrun-bench-drill-") as tmp:
        port = str(c.free_port())  # a multi-node job's rendezvous endpoint: 127.0.0.1:0 given
        lines: queue.Queue[tuple[float, str]] = queue.Queue()
        jobs = [
            _Job([a.replace("127.0.0.1:0", f"127.0.0.1:{port}") for a in [*cmd, *_script(tmp)]],
                 tmp, lines)
            for cmd in cmds
        ]  # fmt: skip
        job = jobs[0]  # reads every node's lines: rank 0's step line is a full-world step
        try:
            for f in range(faults):
                for _ in range(rng.randint(5, 15)):
                    job.until(lambda ln: _STEP.search(ln) is not None, 600 if f == 0 else 120)
                # warm: full pools that had time to import the first steps' modules (the
                # workers report them in their first 90 s), as in any job past its start
                deadline = time.monotonic() + 300
                settled = job.started + settle
                while (
                    warm
                    and time.monotonic() < deadline
                    and (
                        any(_ready(j.proc.pid) < per_node for j in jobs)
                        or time.monotonic() < settled
                    )
                ):
                    time.sleep(0.1)
                # a node without rank 0 (with one node: that one)
                victim = next((j for j in jobs if not j.rank0), jobs[-1])
                workers = _workers(victim.proc.pid)
                if len(workers) < per_node:
                    raise RunFailed(f"found {len(workers)} workers of {per_node}")
                last = -1
                while not job.lines.empty():  # the steps before the kill are read
                    if m := _STEP.search(job.lines.get_nowait()[1]):
                        last = int(m[1])
                t0 = time.monotonic()
                os.kill(rng.choice(workers), signal.SIGKILL)
                # rank 0's start line (its restart count is its own agent's: any will do),
                # then where it resumed; its next step is the world's
                job.until(lambda ln: _STARTED.search(ln) is not None, 600)
                resumed = [last]

                def step(ln: str, resumed: list[int] = resumed) -> bool:
                    if m := _RESUMED.search(ln):  # from shared memory, or a disk checkpoint
                        resumed[0] = int(m[2]) * (SPE if m[1] == "epoch" else 1)
                    return _STEP.search(ln) is not None

                t1 = job.until(step, 600)
                samples.append(t1 - t0)
                lost.append(max(0, last - resumed[0]))
                print(f"  {' '.join(cmds[-1][-4:])}: fault {f + 1}: {t1 - t0:.3f} s, "
                      f"{lost[-1]} steps lost", file=sys.stderr)  # fmt: skip
        finally:
            for j in jobs:
                j.stop()
    return samples, lost


def _p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def _check(results: Mapping[str, Stats | str]) -> bool | None:
    warm, off = results.get("xrun-agent warm"), results.get("xrun-agent off")
    if not isinstance(warm, Stats) or not isinstance(off, Stats):
        return None
    return warm.median <= 0.5 and warm.median <= 0.05 * off.median


Drill = Callable[[int, random.Random], tuple[list[float], list[int]]]


def _row(
    label: str,
    contenders: dict[str, tuple[list[list[str]], bool]],
    results: dict[str, Stats | str],
    reps: int,
    faults: int,
    rng: random.Random,
    settle: float,
    extra: tuple[Mapping[str, Drill], Callable[[], list[str]]] = ({}, list),
) -> Row:
    """Run each contender's drill ``reps`` times, round-robin; its row. ``extra``: contenders
    with a drill of their own (torchft's), run in the same round-robin, and the lines they add
    to the row's note once all ran."""
    drills, notes = extra

    def launcher(cmds: list[list[str]], warm: bool) -> Drill:
        return lambda n, r: _drill(cmds, n, warm, r, settle)

    every = {name: launcher(cmds, warm) for name, (cmds, warm) in contenders.items()}
    every.update(drills)
    samples: dict[str, list[float]] = {k: [] for k in every}
    lost: dict[str, list[int]] = {k: [] for k in every}
    for _ in range(reps):
        for name, drill in every.items():
            if name in results:
                continue
            try:
                xs, ls = drill(faults, rng)
            except RunFailed as e:
                results[name] = f"failed: {e}"
                continue
            samples[name] += xs
            lost[name] += ls
    note = []
    for name, xs in samples.items():
        if name not in results and xs:
            results[name] = Stats(xs)
        if xs:
            note.append(
                f"{name}: median {statistics.median(xs):.3f} s, p95 {_p95(xs):.3f} s, n={len(xs)}, "
                f"steps lost {sum(lost[name])} in all (max {max(lost[name])})"
            )
    return Row(
        label,
        "s",
        "warm <= 0.5 s and <= 0.05x cold (xrun-agent off)",
        results,
        subject="xrun-agent warm",
        reference="xrun-agent off",
        check=_check,
        note="; ".join([*note, *notes()]),
    )


def measure_18(reps: int, smoke: bool) -> list[Row]:
    # smoke: one fault each and no settling (a cold restart alone costs ~20-30 s at load)
    faults = 1 if smoke else 4
    settle = 0 if smoke else 30
    rng = random.Random(34)
    script = _script("")[0].rsplit("/", 1)[-1]
    agent = [c.PYTHON, "-m", "xrun.runtime", "--standalone", "--nproc-per-node", str(NPROC),
             "--max-restarts", str(faults), "--tee", "3"]  # fmt: skip
    try:
        torchrun = [c.tool("torchrun"), "--standalone", "--nproc-per-node", str(NPROC),
                    "--max-restarts", str(faults), "--tee", "3"]  # fmt: skip
    except Unavailable as e:
        torchrun = []
        torchrun_why = str(e)
    contenders: dict[str, tuple[list[list[str]], bool]] = {
        "xrun-agent warm": ([[*agent, "--recover", "warm"]], True),
        "xrun-agent off": ([[*agent, "--recover", "off"]], False),
        "torchrun": ([torchrun], False),
    }
    results: dict[str, Stats | str] = {}
    if not torchrun:
        results["torchrun"] = f"unavailable: {torchrun_why}"
    if not smoke:  # NVIDIA's ft_launcher: its venv needs the package index (CI has none)
        try:
            contenders["ft_launcher"] = ([ftl.standalone(NPROC, faults)], False)
        except Unavailable as e:
            results["ft_launcher"] = f"unavailable: {e}"
    # torchft (two replica groups of 2, its lighthouse, torchrun's in-place relaunch): the full
    # run only, as its venv needs PyPI (benchmarks/torchft_drill.py)
    drills: dict[str, Drill] = {}
    notes: Callable[[], list[str]] = list
    if not smoke:
        from benchmarks import torchft_drill

        try:
            torchft_drill.torchft_python()
            ft = torchft_drill.Drill()
            drills["torchft"] = ft
            notes = lambda: ft.notes(results.get("torchft"), rng)  # noqa: E731
        except Unavailable as e:
            results["torchft"] = f"unavailable: {e}"
    rows = [
        _row(
            f"kill -9 of one worker -> first full-world step, 1x4 gloo DDP ({script})",
            contenders, results, reps, faults, rng, settle=settle,
            extra=(drills, notes),
        )
    ]  # fmt: skip

    # 2x2: two agents (c10d rendezvous on this host), a worker of the second node killed. Smoke
    # (kept cheap: the figures of a smoke run are not quoted): warm only, one fault, no wait
    # beyond full pools; its verdict is then n/a (no cold figure to compare with).
    def nodes(recover: str, n: int) -> list[list[str]]:
        return [[c.PYTHON, "-m", "xrun.runtime", "--nnodes", "2", "--nproc-per-node",
                 str(NPROC // 2), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 "127.0.0.1:0", "--rdzv-id", f"drill-{recover}", "--max-restarts", str(n),
                 "--tee", "3", "--recover", recover] for _ in range(2)]  # fmt: skip

    faults2 = 1 if smoke else faults
    two = {"xrun-agent warm": (nodes("warm", faults2), True)}
    if not smoke:
        two["xrun-agent off"] = (nodes("off", faults2), False)
    rows.append(
        _row(
            f"the same, 2x2 (two agents, local), a worker of the second node killed ({script})",
            two, {}, reps, faults2, rng, settle=settle,
        )
    )  # fmt: skip
    return rows
