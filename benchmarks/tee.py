"""Measure 8: the cost of ``-t 3`` (tee every worker's output to log files and the console).

4 workers print N numbered lines each (``workers/lines.py``, batched writes). Each sample is a
pair run back to back: without tee (the workers write straight into the agent's stdout, a
file) and with ``-t 3 --log-dir``; the figure is tee time / plain time. The tee run's console
file is then checked: every rank's lines present, in order, each whole and prefixed
(``[default<r>]:<r> <i> xxx...``), and so are the per-rank log files. A lost or split line fails xrun (no figure); for a
reference contender (torchrun's tee threads do interleave lines) it is written in the row's
note and the figure kept, since the issue compares against torchrun's time as it is.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import replace

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, at_most, interleave

_LINE = re.compile(rb"\[default(\d+)\]:(\d+) (\d+) x{40}")


def check_console(path: str, nproc: int, count: int) -> None:
    """Raise RunFailed unless the console holds each rank's ``count`` lines, whole and in order."""
    nxt = [0] * nproc
    bad = 0
    example = b""
    with open(path, "rb") as f:
        for line in f:
            m = _LINE.fullmatch(line.rstrip(b"\n"))
            if m is None or m[1] != m[2] or int(m[1]) >= nproc or int(m[3]) != nxt[int(m[1])]:
                if m is None and not line.startswith(b"[default"):
                    continue  # the launcher's own messages
                bad += 1
                example = example or line[:120]
                continue
            nxt[int(m[1])] += 1
    lost = sum(count - n for n in nxt)
    if bad or lost:
        raise RunFailed(
            f"tee console: {lost} line(s) lost, {bad} split/garbled/out of order (e.g. {example!r})"
        )


def check_logs(log_dir: str, nproc: int, count: int) -> None:
    """Raise RunFailed unless each rank's stdout log under ``log_dir`` holds its ``count`` lines
    unchanged (the layout ``<run_id>/attempt_<n>/<local_rank>/stdout.log`` is torchrun's)."""
    found: dict[int, int] = {}
    for dirpath, _, files in os.walk(log_dir):
        if "stdout.log" in files:
            with open(os.path.join(dirpath, "stdout.log"), "rb") as f:
                found[int(os.path.basename(dirpath))] = sum(1 for _ in f)
    if sorted(found) != list(range(nproc)) or any(n != count for n in found.values()):
        raise RunFailed(
            f"tee log files: expected {count} lines for each local rank "
            f"0..{nproc - 1}, found {found}"
        )


def _pair(
    launcher: Callable[[c.Job], list[c.Cmd]],
    job: c.Job,
    tee_times: list[float],
    damage: list[str] | None,
) -> Callable[[], float]:
    """One sample; ``damage`` None -> lost/split lines raise, else they are appended to it."""

    def run() -> float:
        with tempfile.TemporaryDirectory(prefix="xrun-bench-tee-") as tmp:
            plain_out, tee_out = os.path.join(tmp, "plain.out"), os.path.join(tmp, "tee.out")
            plain = c.timed(launcher(job), stdout=plain_out, timeout=300)
            tee_job = replace(job, tee="3", log_dir=os.path.join(tmp, "logs"))
            teed = c.timed(launcher(tee_job), stdout=tee_out, timeout=300)
            try:
                check_console(tee_out, job.nproc, int(job.args[0]))
                check_logs(os.path.join(tmp, "logs"), job.nproc, int(job.args[0]))
            except RunFailed as e:
                if damage is None:
                    raise
                damage.append(str(e))
        tee_times.append(teed)
        return teed / plain

    return run


def measure_8(reps: int, smoke: bool) -> list[Row]:
    count = 2_000 if smoke else 250_000
    job = c.Job("lines.py", args=(str(count),), nproc=4)
    times: dict[str, list[float]] = {"torchrun": [], "xrun-agent": []}
    ratio = Row(
        f"tee -t 3 vs no tee, 4 workers x {count} lines (time ratio)",
        "x",
        "xrun agent <= 1.2x, 0 lines lost or split",
        subject="xrun-agent",
        reference="torchrun",
        check=at_most("xrun-agent", 1.2),
    )
    damage: list[str] = []
    ratio.results = interleave(
        {
            "torchrun": _pair(c.torchrun, job, times["torchrun"], damage),
            "xrun-agent": _pair(c.agent, job, times["xrun-agent"], None),
        },
        reps=reps,
        warmup=False,
    )
    if damage:
        ratio.note = f"torchrun's console lost lines in {len(damage)} run(s): {damage[0]}"
    absolute = Row(
        "the tee runs' wall time (floor: the workers alone, no launcher, no tee)",
        "s",
        "(context)",
        subject="xrun-agent",
        reference="floor",
    )
    floor = interleave({"floor": lambda: _floor(job)}, reps=reps, warmup=False)
    absolute.results = {
        **floor,
        **{k: Stats(v) if v else "no successful run" for k, v in times.items()},
    }
    return [ratio, absolute]


def _floor(job: c.Job) -> float:
    with tempfile.TemporaryDirectory(prefix="xrun-bench-tee-") as tmp:
        return c.timed(c.floor(job), stdout=os.path.join(tmp, "floor.out"), timeout=300)
