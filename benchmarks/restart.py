"""Measure 7: the wall time one worker failure + restart adds to a job.

Each sample is a pair run back to back: a clean run (``fail_once.py clean``: every worker exits
0 at once) and a failing run (global rank 0 exits 1 on the first attempt while its peers sleep;
the launcher must stop them, restart the group - across both agents on 2 nodes - and the second
attempt exits 0). The sample is failing - clean, both with ``--max-restarts 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from benchmarks import contenders as c
from benchmarks.harness import Row, at_most, interleave


def _added(
    launcher: Callable[[c.Job], list[c.Cmd]], job: c.Job, timeout: float
) -> Callable[[], float]:
    def run() -> float:
        clean = c.timed(launcher(replace(job, args=("clean",))), timeout=timeout)
        failed = c.timed(launcher(job), timeout=timeout)
        return failed - clean

    return run


def measure_7(reps: int, smoke: bool) -> list[Row]:
    # torchrun's 2-node restart sometimes never completes (seen: past 100 s, where it usually
    # takes ~5 s): the cap bounds what that costs the run.
    timeout = 30.0 if smoke else 60.0
    rows = []
    for nnodes, nproc, label in ((1, 4, "1 node (1x4)"), (2, 2, "2 nodes (2x2)")):
        job = c.Job("fail_once.py", nnodes=nnodes, nproc=nproc, max_restarts=1)
        row = Row(
            f"one worker failure + restart, added wall time, {label}",
            "s",
            "xrun agent <= +0.1 s",
            subject="xrun-agent",
            reference="torchrun",
            check=at_most("xrun-agent", 0.10),
        )
        row.results = interleave(
            {
                "torchrun": _added(c.torchrun, job, timeout),
                "xrun-agent": _added(c.agent, job, timeout),
            },
            reps,
            warmup=not smoke,
        )
        rows.append(row)
    return rows
