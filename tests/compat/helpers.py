"""Small helpers for the compat tests (the names under test come from ``shim``)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose: reaped or not, it runs nothing
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def script(tmp_path: Path, name: str, code: str) -> str:
    """Write an executable Python script; its path."""
    path = tmp_path / name
    path.write_text(f"#!{PY}\n" + textwrap.dedent(code))
    path.chmod(0o755)
    return str(path)


def rank_fn(msg: str) -> str:
    """A function worker: prints a line on each stream and returns ``<msg>_<RANK>``."""
    rank = os.environ["RANK"]
    print(f"{msg} out {rank}", flush=True)
    print(f"{msg} err {rank}", file=sys.stderr, flush=True)
    return f"{msg}_{rank}"


def fail_or_sleep(rank: int) -> None:
    """Rank 0 raises at once; the others sleep a minute (they must be stopped)."""
    import time

    if rank == 0:
        raise ValueError("rank 0 failed on purpose")
    time.sleep(60)


def env_of(keys: tuple[str, ...]) -> dict[str, str | None]:
    """A function worker: the worker's values of ``keys``."""
    return {k: os.environ.get(k) for k in keys}


def return_after(delay: float, out_dir: str) -> int:
    """Sleep ``delay`` s, return the rank; the process writes the time it really exits (at
    interpreter exit, after its launcher let it go) to ``out_dir/exit.<rank>``."""
    import atexit
    import time

    rank = int(os.environ["RANK"])

    def record() -> None:
        with open(os.path.join(out_dir, f"exit.{rank}"), "w") as f:
            f.write(repr(time.time()))

    atexit.register(record)
    time.sleep(delay)
    return rank
