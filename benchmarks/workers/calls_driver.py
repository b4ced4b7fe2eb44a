"""Measure 22's driver: submits a trivial function to the Slurm cluster with xrun or with
submitit (argv[1]) and prints one JSON line of timings: each single call's submit -> result, and
one map of N calls' submit -> every result. Run by benchmarks/calls.py, xrun's side with the
project's python, submitit's with its own venv's. The function is defined here, in __main__, so
both pickle it by value (cloudpickle), as a notebook's function would be."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def add_one(x: int) -> int:
    return x + 1


def _xrun(folder: str, tag: str) -> tuple[Any, Any]:
    import xrun

    ex = xrun.Executor("slurm", folder=folder, cpu=1, memMB=256, cfg={"job_name": tag})
    return ex.submit, ex.map_array


def _submitit(folder: str, tag: str) -> tuple[Any, Any]:
    import submitit

    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(
        timeout_min=30, cpus_per_task=1, slurm_mem="256M", slurm_partition="debug", name=tag
    )
    return ex.submit, ex.map_array


def main() -> int:
    which, folder, singles, n, tag = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5],
    )
    submit, map_array = (_xrun if which == "xrun" else _submitit)(folder, tag)
    one: list[float] = []
    for i in range(singles):
        t0 = time.monotonic()
        job = submit(add_one, i)
        assert job.result() == i + 1, "a wrong result"
        one.append(time.monotonic() - t0)
    many = None
    if n:
        t0 = time.monotonic()
        jobs = map_array(add_one, range(n))
        assert [j.result() for j in jobs] == [i + 1 for i in range(n)], "a wrong result"
        many = time.monotonic() - t0
    print(json.dumps({"one": one, "map": many, "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
