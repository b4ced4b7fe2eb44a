"""Measure 5: what a user waits for before anything runs: ``import xrun`` and a dry run.

Both are whole processes (interpreter start included), timed from spawn to exit; a bare
``python -c pass`` is the floor every Python program pays.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from benchmarks import contenders as c
from benchmarks.harness import Row, Unavailable, at_most, interleave


def _dryrun(exe_name: str, module: str) -> Callable[[], float]:
    def run() -> float:
        if importlib.util.find_spec(module) is None:
            raise Unavailable(f"{module} is not importable")
        job = c.Job("noop.py")
        cmd = [
            c.tool(exe_name),
            "run",
            "--dryrun",
            "-s",
            "local_cwd",
            "dist.ddp",
            "-j",
            "1x4",
            "--script",
            job.path,
        ]
        return c.timed([(cmd, {})], timeout=60)

    return run


def _python(code: str) -> Callable[[], float]:
    return lambda: c.timed([([c.PYTHON, "-c", code], {})], timeout=60)


def measure_5(reps: int, smoke: bool) -> list[Row]:
    n = reps if smoke else reps * 2  # cheap: more samples steady the median
    imp = Row(
        "import xrun (whole process)",
        "s",
        "xrun <= 0.10 s",
        reference="python (bare)",
        check=at_most("xrun", 0.10),
    )
    imp.results = interleave(
        {
            "python (bare)": _python("pass"),
            "xrun": _python("import xrun"),
            "torchx": _python("import torchx")
            if importlib.util.find_spec("torchx")
            else _unavailable("torchx is not installed (optional)"),
        },
        n,
        warmup=not smoke,
    )
    dry = Row(
        "run --dryrun -s local_cwd dist.ddp -j 1x4",
        "s",
        "xrun <= 0.10 s",
        reference="torchx",
        check=at_most("xrun", 0.10),
    )
    dry.results = interleave(
        {
            "python (bare)": _python("pass"),
            "torchx": _dryrun("torchx", "torchx"),
            "xrun": _dryrun("xrun", "xrun.cli"),
        },
        n,
        warmup=not smoke,
    )
    return [imp, dry]


def _unavailable(reason: str) -> Callable[[], float]:
    def run() -> float:
        raise Unavailable(reason)

    return run
