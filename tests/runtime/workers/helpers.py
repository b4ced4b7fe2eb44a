"""Worker functions and helpers for the start_processes tests.

The functions live at module level in a module that is not a test file, so spawn and
forkserver children can unpickle them by reference.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

PY = sys.executable


# -- function entrypoints (module level, so spawn can pickle them) ----------------------------


@dataclass
class Point:
    x: int
    tags: list[str]


def returns_by_rank(rank: int) -> object:
    env = {k: os.environ[k] for k in ("MY_RANK", "TORCHELASTIC_ERROR_FILE")}
    return [{"rank": rank, "env": env}, Point(rank, ["a", "b"])][rank]


def raises_or_sleeps(rank: int) -> None:
    if rank == 1:
        raise ValueError(f"rank {rank} saw a bad batch")
    time.sleep(30)


def ready_code(ready_file) -> str:
    """Python source that marks it runs (the user's code: past the worker's prctl), then sleeps."""
    return f"import time; open({str(ready_file)!r}, 'w').close(); time.sleep(60)"


def kills_itself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def prints(rank: int) -> int:
    print(f"out from {rank}", flush=True)
    print(f"err from {rank}", file=sys.stderr, flush=True)
    return rank


def envs(n: int, **extra: str) -> dict[int, dict[str, str]]:
    return {r: {"MY_RANK": str(r), **extra} for r in range(n)}


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
