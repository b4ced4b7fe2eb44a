"""One reading of a worker's attempt from its environment: the call folder's attempt
(``Attempt.of_env``) and the tracker's attempt key (``attempt.R.S`` in the run's metadata) are
the same (requeues, start), edge cases included."""

from __future__ import annotations

import pytest

from xrun.attempt_env import attempt_of_env, count
from xrun.calls.files import Attempt
from xrun.tracker.attempts import metadata

ROUND, RESTARTS, REQUEUES = "XRUN_ROUND", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (0, 0)),
        ({ROUND: "3", RESTARTS: "1"}, (0, 3)),  # the round, not rank 0's lagging count
        ({RESTARTS: "2"}, (0, 2)),  # another agent: its restart count
        ({ROUND: "0", RESTARTS: "5", REQUEUES: "2"}, (2, 0)),  # a requeue starts at round 0
        ({ROUND: "", RESTARTS: "4"}, (0, 4)),  # no round given: the count
        ({ROUND: "-1", RESTARTS: "x", REQUEUES: "1e3"}, (0, 0)),  # no counts at all
        ({ROUND: "9" * 10, REQUEUES: "9" * 9}, (999_999_999, 0)),  # 10 digits: no count
        ({ROUND: "\u00b2", RESTARTS: "1"}, (0, 1)),  # "²".isdigit(), yet no int: no count
    ],
)
def test_the_call_folder_and_the_tracker_read_one_attempt(
    env: dict[str, str], expected: tuple[int, int]
) -> None:
    assert attempt_of_env(env) == expected
    requeues, start = expected
    attempt = Attempt.of_env({**env, "WORLD_SIZE": "4"})
    assert (attempt.requeues, attempt.round, attempt.world) == (requeues, start, 4)
    keys = [k for k in metadata(env) if k.startswith("attempt.")]
    assert keys == [f"attempt.{requeues}.{start}"]


def test_a_count_is_ascii_digits_only() -> None:
    """Anything else is no count, never an error: a superscript digit passes ``isdigit`` but
    not ``int``."""
    env = {"A": "12", "B": " 1", "C": "+1", "D": "\u00b2", "E": "\u0663", "F": "123456789"}
    env["G"] = "1234567890"
    assert {k: count(env, k) for k in [*env, "unset"]} == {
        "A": 12,
        "B": None,
        "C": None,
        "D": None,
        "E": None,
        "F": 123456789,
        "G": None,
        "unset": None,
    }
