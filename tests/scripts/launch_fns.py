"""Worker functions for tests/test_launch.py (importable by spawned workers; stdlib only)."""

from __future__ import annotations

import os

from xrun.runtime.errors import record

KEYS = (
    "LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE "
    "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
    "TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCH_NCCL_ASYNC_ERROR_HANDLING "
    "TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS"
).split()


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
