"""Measure 14: reliability, not speed. ``N`` consecutive 1x2 gloo all_reduce jobs under xrun's
agent (``python -m xrun.runtime --nproc-per-node 2``) while a port thief
(``benchmarks/port_thief.py``) keeps taking freed ports: every job must succeed and no worker
may die of SIGABRT. Before issue #14, rank 0's worker hosted the workers' store on a port its
agent had picked and released: the thief failed jobs with "address already in use", and about
1 run in 20 a worker aborted at exit ("terminate called without an active exception"), its
store gone while a peer still talked to it.

``python -m benchmarks.reliability [N]`` runs it alone and prints one line of JSON. The worker
is a plain script (``workers/allreduce_plain.py``) that exits normally, as users' scripts do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks import contenders as c
from benchmarks.harness import Row, Stats
from benchmarks.port_thief import Thief

FULL_RUNS = 200
SMOKE_RUNS = 2
_ABORT = ("terminate called", "SIGABRT", "Signal 6", "exitcode  : -6")


def run(n: int) -> dict[str, Any]:
    """``n`` jobs in a row under a port thief: failures, aborts, and the first failure's
    stderr tail."""
    failures, aborts, first = 0, 0, ""
    script = str(c.WORKERS / "allreduce_plain.py")
    with Thief() as thief, tempfile.TemporaryDirectory(prefix="xrun-bench-") as cwd:
        for _ in range(n):
            p = subprocess.run(
                [c.PYTHON, "-m", "xrun.runtime", "--nproc-per-node", "2", script],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, **c.BASE_ENV},
                stdin=subprocess.DEVNULL,
            )
            aborted = any(m in p.stderr for m in _ABORT)
            aborts += aborted
            if p.returncode != 0 or aborted:
                failures += 1
                first = first or p.stderr[-1500:]
    return {
        "runs": n,
        "failures": failures,
        "aborts": aborts,
        "stolen": thief.stolen,
        "first": first,
    }


def measure_14(reps: int, smoke: bool) -> list[Row]:
    n = SMOKE_RUNS if smoke else FULL_RUNS
    result = run(n)
    rows = []
    for key, label in (("failures", "jobs that failed"), ("aborts", "workers that aborted")):
        row = Row(
            f"{label}, {n} x 1x2 gloo jobs under a port thief",
            "jobs" if key == "failures" else "aborts",
            "0",
            reference="xrun",
            check=_zero,
        )
        row.results = {"xrun": Stats([float(result[key])])}
        if key == "failures":
            row.note = f"the thief held {result['stolen']} ports in all" + (
                f"; first failure: {result['first'][-300:]!r}" if result["first"] else ""
            )
        rows.append(row)
    return rows


def _zero(results: Any) -> bool | None:
    s = results.get("xrun")
    return s.median == 0 if isinstance(s, Stats) else None


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else FULL_RUNS)), flush=True)
