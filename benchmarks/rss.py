"""Measure 4: the agent's peak RSS (the launcher process alone, never its workers).

The agent runs a 1x4 job of workers that sleep, and this process samples the agent's
``VmHWM`` (the kernel's high-water mark of its resident set) from ``/proc/<pid>/status`` every
few milliseconds until it exits; the last value read is its peak while the job ran. A bare
interpreter (``python -c`` sleeping as long) is shown for scale: no Python agent can be smaller.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, at_most, interleave

SLEEP_S = "1.0"


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def peak_rss_mib(cmd: c.Cmd) -> float:
    argv, env = cmd
    with (
        tempfile.TemporaryDirectory(prefix="xrun-bench-") as cwd,
        tempfile.TemporaryFile() as errf,
    ):  # a file, not a pipe nobody drains meanwhile
        p = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **c.BASE_ENV, **env},
            stdout=subprocess.DEVNULL,
            stderr=errf,
        )
        peak = 0
        while p.poll() is None:
            kib = _vm_hwm_kib(p.pid)  # None once it is a zombie: keep the last value
            peak = max(peak, kib or 0)
            time.sleep(0.005)
        errf.seek(0)
        err = errf.read()
    if p.returncode != 0:
        raise RunFailed(f"{argv[:3]} exited {p.returncode}: {err[-500:].decode(errors='replace')}")
    return peak / 1024


def measure_4(reps: int, smoke: bool) -> list[Row]:
    job = c.Job("sleep.py", args=(SLEEP_S if not smoke else "0.5",), nproc=4)

    def one(launcher: Callable[[c.Job], list[c.Cmd]]) -> Callable[[], float]:
        return lambda: peak_rss_mib(launcher(job)[0])

    bare: c.Cmd = ([c.PYTHON, "-c", f"import time; time.sleep({job.args[0]})"], {})
    row = Row(
        "agent peak RSS (VmHWM), 1x4 job",
        "MiB",
        "xrun agent <= 30 MiB",
        subject="xrun-agent",
        reference="torchrun",
        check=at_most("xrun-agent", 30.0),
    )
    row.results = interleave(
        {
            "python (bare)": lambda: peak_rss_mib(bare),
            "torchrun": one(c.torchrun),
            "xrun-agent": one(c.agent),
        },
        reps=min(reps, 3),
        warmup=False,
    )
    return [row]
