"""Measure 20's reading of a launcher's output (benchmarks/node_loss.py, recovery.py's ``_Job``):
NVIDIA's ft_launcher prints blank lines, which must not read as the end of a job's output, and
its workers' lines carry torchrun's prefix, by which the driver tells the spare from the nodes
that run workers. Real processes (a shell's printf); the drill itself runs in
``python -m benchmarks --only 20``."""

from __future__ import annotations

import sys
import tempfile

from benchmarks.node_loss import _WORKER
from benchmarks.recovery import _Job


def test_a_blank_line_is_not_the_end_of_the_output() -> None:
    # ft_launcher's start-up banner ends with an empty line; the job goes on after it
    script = "import sys, time; print('banner'); print(); print(); time.sleep(0.5); print('step 7')"
    with tempfile.TemporaryDirectory() as tmp:
        job = _Job([sys.executable, "-c", script], tmp)
        try:
            job.until(lambda ln: ln.endswith("step 7"), timeout=120)
        finally:
            job.stop()


def test_a_worker_line_is_told_from_a_launcher_line() -> None:
    workers = ["[default0]:rank 2/4: started (restart 0)", "[trainer11]:step 3"]
    launcher = [
        "[2026-11-27 22:53:47,595] [INFO] [ft_launcher15071@vm] The node 'x' has joined round 0",
        "[W1127 22:53:47.106989902 socket.cpp:525] [c10d] The server socket has failed to bind",
        "[2026-11-27 22:49:33,901] [INFO] [RankMonServer11775@vm:<none>] Received request",
        "  rdzv_configs     : {'timeout': 900}",
    ]
    assert all(_WORKER.match(ln) for ln in workers)
    assert not any(_WORKER.match(ln) for ln in launcher)
