"""Measure 17: what keeping the training state in shared memory costs a step (issue #34).

One worker process (``workers/snapshot_cost.py``) holds a 100 MiB state (a model of float32
parameters under plain SGD; 10 MiB with ``--smoke``) and times, round robin, committing it with
``xrun.runtime.snapshot`` (tensor bytes copied into a preallocated /dev/shm slot) against
``torch.save`` of the same state to a file on /dev/shm, to disk (page cache) and to disk with
``fsync``. Rows: the cost per commit, the /dev/shm memory the snapshots hold, and one restore.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats

SNAPSHOT, SHM, DISK, FSYNC = "xrun-snapshot", "torch.save shm", "torch.save disk", "disk+fsync"


def _run(mib: int, reps: int) -> dict[str, object]:
    # Disk: a folder beside the benchmarks (the repo's filesystem), never a tmpfs.
    with tempfile.TemporaryDirectory(prefix="xrun-bench-disk-", dir=c.WORKERS.parent) as disk:
        proc = subprocess.run(
            [c.PYTHON, str(c.WORKERS / "snapshot_cost.py"), str(mib), str(reps), disk],
            capture_output=True,
            text=True,
            timeout=120 + 20 * reps,
            env={**os.environ, **c.BASE_ENV},
        )
    if proc.returncode != 0:
        raise RunFailed(f"snapshot_cost.py exited {proc.returncode}: {proc.stderr[-500:]}")
    out: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return out


def _cheaper(results: Mapping[str, Stats | str]) -> bool | None:
    s, ref = results.get(SNAPSHOT), results.get(SHM)
    if not isinstance(s, Stats) or not isinstance(ref, Stats):
        return None
    return s.median <= 0.25 * ref.median


def measure_17(reps: int, smoke: bool) -> list[Row]:
    mib = 8 if smoke else 100
    size = f"{mib} MiB state"
    cost = Row(
        f"commit a {size} (model + optimizer + RNG), per step",
        "s",
        "xrun snapshot <= 0.25x torch.save to /dev/shm",
        subject=SNAPSHOT,
        reference=SHM,
        check=_cheaper,
    )
    memory = Row(f"/dev/shm held per rank, {size}", "MiB", "-", subject=SNAPSHOT, reference=SHM)
    restore = Row(f"restore a {size} after a restart", "s", "-", subject=SNAPSHOT, reference=SHM)
    try:
        got = _run(mib, max(2, reps * 2))
    except (RunFailed, subprocess.TimeoutExpired, ValueError) as e:
        why = f"failed: {type(e).__name__}: {str(e)[:300]}"
        for row in (cost, memory, restore):
            row.results = {SNAPSHOT: why}
        return [cost, memory, restore]
    samples = got["samples"]
    assert isinstance(samples, dict)
    cost.results = {
        SNAPSHOT: Stats(samples["snapshot"]),
        SHM: Stats(samples["shm"]),
        DISK: Stats(samples["disk"]),
        FSYNC: Stats(samples["disk_fsync"]),
    }
    cost.note = "the first commit to each slot allocates it (once per job) and is not counted"
    memory.results = {
        SNAPSHOT: Stats([float(got["shm_bytes"]) / 2**20]),  # type: ignore[arg-type]
        SHM: Stats([float(got["save_bytes"]) / 2**20]),  # type: ignore[arg-type]
    }
    memory.note = "two slots (the newest and the one before), each the state + 1/8 slack"
    restore.results = {
        SNAPSHOT: Stats([float(got["restore_s"])]),  # type: ignore[arg-type]
        SHM: Stats([float(got["load_s"])]),  # type: ignore[arg-type]
    }
    restore.note = "xrun: into the model (load_state_dict) with the RNGs; torch: torch.load only"
    return [cost, memory, restore]
