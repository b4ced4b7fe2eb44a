"""Worker functions for tests/runtime/agent/test_launch.py (importable by spawned workers; stdlib only)."""

from __future__ import annotations

import os

from worker_env import KEYS

from xrun.runtime.errors import record


def env_of_worker() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in KEYS}


def env_var(name: str) -> str | None:
    return os.environ.get(name)


def scaled_rank(factor: int) -> int:
    return int(os.environ["RANK"]) * factor


def fail_on_first_attempt() -> str:
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "1":
        raise RuntimeError("first attempt fails")
    return os.environ["TORCHELASTIC_RESTART_COUNT"]


@record
def always_fail() -> None:
    raise ValueError(f"rank {os.environ['RANK']} is broken")
