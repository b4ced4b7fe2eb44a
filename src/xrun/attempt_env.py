"""Which start of a job a worker is in, as its environment says: one reading for the two that
key things by it, the call folder's attempt folders (:mod:`xrun.calls.files`) and the tracker's
attempt metadata (:mod:`xrun.tracker.attempts`), so they never disagree about an attempt.

Ground: the worker of ``xrun.submit`` imports it on start-up, before anything else of xrun.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xrun.contract import RDZV_ROUND_ENV

if TYPE_CHECKING:
    from collections.abc import Mapping

# The runtime agent's failure restarts so far (torchrun's name; each agent's own count).
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# Slurm's count of the job's requeues so far, in every task of a requeued job.
SLURM_RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"


def count(env: Mapping[str, str], name: str) -> int | None:
    """``env[name]`` as a count (ASCII digits only, under 10 of them); None when unset or not
    one (``str.isdigit`` alone takes ``²``, which ``int`` refuses)."""
    value = env.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None


def attempt_of_env(env: Mapping[str, str]) -> tuple[int, int]:
    """(requeues, start): Slurm's requeues (0 without), and which start of the workers this
    is: the rendezvous round where the agent gives one (the same in every worker of a start;
    an agent's restart count skips membership restarts, so rank 0's count can lag the
    others'), else the restart count (an agent other than xrun's)."""
    start = count(env, RDZV_ROUND_ENV)
    if start is None:
        start = count(env, RESTART_COUNT_ENV) or 0
    return count(env, SLURM_RESTART_COUNT_ENV) or 0, start
