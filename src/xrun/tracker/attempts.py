"""What a job's run records about itself when it opens: which attempt this is, its sweep values.

A restart of the workers (``TORCHELASTIC_RESTART_COUNT``), a Slurm requeue
(``SLURM_RESTART_COUNT``) or a docker retry starts the same logical job again; it records into
the same run (the job id does not change) and adds the attempt here, as metadata, so the run
shows every attempt instead of a new run per attempt. A sweep's trial records its values.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from xrun.attempt_env import RESTART_COUNT_ENV, SLURM_RESTART_COUNT_ENV, attempt_of_env, count
from xrun.contract import SWEEP_ENV_PREFIX, SWEEP_SIZE_ENV, TRIAL_INDEX_ENV


def is_recorder(env: Mapping[str, str]) -> bool:
    """Only global rank 0 records (a process that is no worker of a dist job has no RANK):
    one entry per attempt, not one per worker."""
    return env.get("RANK", "0") == "0"


def number(text: str) -> int | float | str:
    """A sweep value as recorded: a number when it reads as one (so trials sort by it)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text  # nan/inf: no number JSON can carry


def metadata(env: Mapping[str, str]) -> dict[str, object]:
    """``restart_count`` / ``slurm_restart_count`` (the latest attempt), ``attempt.R.S``
    (R requeues, S the start: the rendezvous round) = when that attempt opened the run, and for
    a sweep's trial ``sweep.trial`` and ``sweep.<param>`` (its values)."""
    requeues, start = attempt_of_env(env)  # the same attempt as the call folder's
    out: dict[str, object] = {
        "restart_count": count(env, RESTART_COUNT_ENV) or 0,
        f"attempt.{requeues}.{start}": round(time.time(), 3),
    }
    if SLURM_RESTART_COUNT_ENV in env:
        out["slurm_restart_count"] = requeues
    if TRIAL_INDEX_ENV in env:
        out["sweep.trial"] = number(env[TRIAL_INDEX_ENV])
        for name, value in env.items():
            if name.startswith(SWEEP_ENV_PREFIX) and name != SWEEP_SIZE_ENV:
                out["sweep." + name[len(SWEEP_ENV_PREFIX) :].lower()] = number(value)
    return out
