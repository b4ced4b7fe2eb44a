"""Measures 9 and 10: sweeps at scale (issue #18).

9. ``xrun run --dryrun`` of a 10,000-trial grid (100 x 100 values, dist.ddp -j 2x2), for slurm
   (the trial table is in the printed sbatch script) and local_cwd, whole processes; side by
   side with the dry run of ONE app (the reference) and a bare interpreter. Target < 1 s.
10. ``xrun status`` of a 1,000-trial sweep on the real Slurm cluster (scripts/slurm-cluster.sh):
   ONE sbatch submits it, and each status makes ONE squeue call (counted by a wrapper first on
   PATH; a status making more fails the contender); side by side with that squeue call alone.
   Target < 1 s. The sweep is submitted held (every task PENDING, squeue lists 1,000 lines);
   the full run then releases it, lets the 1,000 trials (``true``) run and measures again with
   every trial ended (1,000 trial dirs read as well). The smoke run submits 20 trials: Slurm
   splits a cancelled array into one job record per task and keeps each for MinJobAge (an hour
   on the test cluster), so 1,000 per suite run filled the cluster's 10,000-record job table
   after nine runs within the hour, and every later sbatch waited.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Unavailable, at_most, interleave

GRID = ",".join(str(i) for i in range(100))
TRIALS_10 = 1000
TRIALS_10_SMOKE = 20


# --------------------------------------------------------------------------- 9
def _dryrun(scheduler: str, sweep: bool, out: Path) -> Callable[[], float]:
    def run() -> float:
        argv = [c.tool("xrun"), "run", "--dryrun", "-s", scheduler]
        if sweep:
            argv += ["--sweep", f"a={GRID}", "--sweep", f"b={GRID}"]
        argv += ["dist.ddp", "-j", "2x2", "--script", "train.py", "--", "--a", "--b"]
        if sweep:
            argv[-2:] = ["--a", "{{a}}", "--b", "{{b}}"]
        # in a folder holding the script: slurm's dry run checks the job will find it
        (out.parent / "train.py").write_text("")
        seconds = c.timed([(argv, {})], cwd=str(out.parent), stdout=str(out), timeout=60)
        text = out.read_text()
        if sweep and not re.search(r"^#\s+9999\s+99\s+99$", text, flags=re.M):
            raise RunFailed(f"the {scheduler} dry run did not print the 10,000-trial table")
        if (
            sweep
            and scheduler == "slurm"
            and "\n9999) XRUN_SWEEP_A=99 XRUN_SWEEP_B=99 ;;" not in text
        ):
            raise RunFailed("the slurm dry run's script lacks the trial table")
        return seconds

    return run


def measure_9(reps: int, smoke: bool) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="xrun-bench-sweep-") as tmp:
        out = Path(tmp) / "out.txt"
        for scheduler in ("slurm", "local_cwd"):
            row = Row(
                f"run --dryrun, 10,000 trials (--sweep a=0..99 --sweep b=0..99), {scheduler}",
                "s",
                "xrun sweep < 1 s",
                subject="xrun sweep",
                reference="xrun one app",
                check=at_most("xrun sweep", 1.0),
            )
            row.results = interleave(
                {
                    "python (bare)": lambda: c.timed([([c.PYTHON, "-c", "pass"], {})]),
                    "xrun one app": _dryrun(scheduler, False, out),
                    "xrun sweep": _dryrun(scheduler, True, out),
                },
                reps,
                warmup=not smoke,
            )
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- 10
SQUEUE_FORMAT = "%F|%K|%A|%T|%r|%N"


class SlurmSweep:
    """A sweep of ``trials`` trials submitted held, with its own state dir and counting
    squeue."""

    def __init__(self, tmp: str, trials: int) -> None:
        c.require_slurm()
        self.tmp = Path(tmp)
        self.trials = trials
        self.calls = self.tmp / "squeue.calls"
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "squeue"
        wrapper.write_text(
            f'#!/bin/sh\necho "$*" >>{self.calls}\nexec {shutil.which("squeue")} "$@"\n'
        )
        wrapper.chmod(0o755)
        self.env = {
            "XDG_STATE_HOME": str(self.tmp / "state"),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        }
        values = ",".join(str(i) for i in range(trials))
        proc = subprocess.run(
            [
                c.tool("xrun"),
                "run",
                "-s",
                "slurm",
                "-cfg",
                "extra_sbatch_args=--hold",
                "--sweep",
                f"i={values}",
                "utils.sh",
                "--cpu",
                "1",
                "--memMB",
                "10",
                "true",
            ],  # fmt: skip
            cwd=tmp,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RunFailed(f"submitting the sweep failed: {proc.stderr.strip()[-500:]}")
        self.handle = proc.stdout.strip()
        self.job = self.handle.rsplit("/", 1)[1]

    def status(self, expect: str) -> Callable[[], float]:
        def run() -> float:
            self.calls.unlink(missing_ok=True)
            out = self.tmp / "status.txt"
            seconds = c.timed(
                [([c.tool("xrun"), "status", self.handle], self.env)], stdout=str(out)
            )
            calls = self.calls.read_text().splitlines()
            if len(calls) != 1:
                raise RunFailed(f"xrun status made {len(calls)} squeue calls, not 1: {calls}")
            text = out.read_text()
            n = self.trials
            if f"Trials: {n} trials: {n} {expect}" not in text:
                raise RunFailed(f"status does not say {n} {expect}: {text[:300]}")
            return seconds

        return run

    def squeue(self) -> float:
        argv = ["squeue", "-h", "-r", "-t", "all", "-j", self.job, "-o", SQUEUE_FORMAT]
        return c.timed([(argv, {})])

    def run_to_the_end(self, timeout: float = 900) -> None:
        subprocess.run(["scontrol", "release", self.job], check=True, capture_output=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = subprocess.run(
                [
                    "squeue",
                    "-h",
                    "-r",
                    "-t",
                    "pending,running,completing",
                    "-j",
                    self.job,
                    "-o",
                    "%K",
                ],
                capture_output=True,
                text=True,
            ).stdout.split()
            if not live:
                return
            time.sleep(5)
        raise RunFailed(f"the {self.trials} trials did not end within {timeout:.0f} s")

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job], capture_output=True)


def _row(label: str, sweep: SlurmSweep, expect: str, reps: int, smoke: bool) -> Row:
    row = Row(
        label,
        "s",
        "xrun < 1 s, 1 squeue call",
        subject="xrun",
        reference="squeue (the one call)",
        check=at_most("xrun", 1.0),
    )
    row.results = interleave(
        {"squeue (the one call)": sweep.squeue, "xrun": sweep.status(expect)},
        reps,
        warmup=not smoke,
    )
    return row


def measure_10(reps: int, smoke: bool) -> list[Row]:
    trials = TRIALS_10_SMOKE if smoke else TRIALS_10
    label = f"xrun status of a {trials:,}-trial slurm sweep"
    with tempfile.TemporaryDirectory(prefix="xrun-bench-sweep-") as tmp:
        try:
            sweep = SlurmSweep(tmp, trials)
        except (Unavailable, RunFailed) as e:
            row = Row(f"{label} (all pending)", "s", "xrun < 1 s, 1 squeue call")
            kind = "unavailable" if isinstance(e, Unavailable) else "failed"
            row.results = {"xrun": f"{kind}: {e}"}
            return [row]
        try:
            rows = [_row(f"{label} (all pending)", sweep, "PENDING", reps, smoke)]
            if not smoke:
                t0 = time.monotonic()
                sweep.run_to_the_end()
                done = _row(f"{label} (all ended)", sweep, "SUCCEEDED", reps, smoke)
                done.note = f"the {trials} trials ran in {time.monotonic() - t0:.0f} s"
                rows.append(done)
            return rows
        finally:
            sweep.cancel()
