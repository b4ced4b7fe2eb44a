"""Measure 18's victim (benchmarks/recovery.py ``_workers``): a worker of the launcher, never
one of NVIDIA's ft_launcher's rank monitors, which it forks beside its workers (one per local
rank, named as it is: killing one would be no worker's failure). Real processes: a parent
named ``ft_launcher`` (its ``/proc/self/comm``) with a fork and a spawned worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from benchmarks.recovery import _children, _comm, _workers

PARENT = """
import os, subprocess, sys, time
with open("/proc/self/comm", "w") as f:
    f.write("ft_launcher")
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
if os.fork() == 0:  # the rank monitor: a fork, its name inherited
    time.sleep(120)
    os._exit(0)
print(worker.pid, flush=True)
time.sleep(120)
"""


def test_the_victim_is_a_worker_not_a_rank_monitor() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        deadline = time.monotonic() + 60
        # Popen returns once the worker's exec is past its point of no return, before the
        # kernel renames it (it is then still "ft_launcher"): the drill's workers are long past
        while (
            len(_children(proc.pid)) < 2 or _comm(worker) == "ft_launcher"
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_children(proc.pid)) == 2
        assert _workers(proc.pid) == [worker]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
