"""Measure 19's figures (benchmarks/preemption.py) from the events its worker writes: what counts
as a checkpoint of one agreed step, steps lost, double or lost requeues. Synthetic events (the
real ones come from the Slurm runs of ``python -m benchmarks --only 19``)."""

from __future__ import annotations

from benchmarks.preemption import Outcome, Preemption, figures


def _attempt(t: float, attempt: int, start: int, last: list[int], saved: int | None) -> list[dict]:
    """Rank r trains steps start+1..last[r] from time t (0.1 s apart); rank 0 may save."""
    evs = [{"t": t, "rank": r, "attempt": attempt, "job": "7", "kind": "start", "step": start}
           for r in range(4)]  # fmt: skip
    for r, end in enumerate(last):
        evs += [{"t": t + 0.1 * (s - start), "rank": r, "attempt": attempt, "job": "7",
                 "kind": "step", "step": s} for s in range(start + 1, end + 1)]  # fmt: skip
    if saved is not None:
        evs.append({"t": t + 5, "rank": 0, "attempt": attempt, "job": "7", "kind": "saved",
                    "step": saved})  # fmt: skip
    return evs


def test_an_agreed_stop_resumed_from_its_step_counts_and_loses_nothing() -> None:
    evs = _attempt(0, 0, 0, [8, 8, 8, 8], saved=8) + _attempt(20, 1, 8, [30] * 4, None)
    evs.append({"t": 25, "rank": 0, "attempt": 1, "job": "7", "kind": "done", "step": 30})
    out = Outcome([Preemption(t=0.6, released=6.0, requeued=7.0)], evs, "ref", 1, {"7"})
    f = figures(out, 1, "ref")
    assert (f.agreed, f.lost, f.identical, f.runs, f.bad_requeues) == (1, [0.0], True, 1, 0)
    assert f.released == [6.0 - 0.6] and f.resumed == [20 + 0.1 - 7.0]


def test_ranks_at_different_steps_or_a_resume_from_scratch_are_no_agreed_checkpoint() -> None:
    # one rank trained a step beyond the saved one: not one agreed step; 1 step lost
    evs = _attempt(0, 0, 0, [8, 9, 8, 8], saved=8) + _attempt(20, 1, 8, [30] * 4, None)
    f = figures(Outcome([Preemption(t=0.6)], evs, "x", 1, {"7"}), 1, "ref")
    assert (f.agreed, f.lost, f.identical) == (0, [1.0], False)
    # no checkpoint, the job requeued by Slurm starts again from step 0: all 12 steps lost
    evs = _attempt(0, 0, 0, [12] * 4, None) + _attempt(90, 1, 0, [30] * 4, None)
    f = figures(Outcome([Preemption(t=0.6)], evs, "ref", 1, {"7"}), 1, "ref")
    assert (f.agreed, f.lost, f.bad_requeues) == (0, [12.0], 0)


def test_double_and_lost_requeues_are_counted() -> None:
    evs = _attempt(0, 0, 0, [8] * 4, saved=8) + _attempt(20, 2, 8, [30] * 4, None)
    f = figures(Outcome([Preemption(t=0.6)], evs, "ref", 2, {"7"}), 1, "ref")
    assert f.bad_requeues == 1 and "1 extra" in f.note  # Slurm restarted it twice for one
    evs = _attempt(0, 0, 0, [8] * 4, saved=8)  # stopped and saved, never came back
    f = figures(Outcome([Preemption(t=0.6)], evs, None, 0, {"7"}), 1, "ref")
    assert f.bad_requeues == 1 and f.agreed == 0 and "1 never resumed" in f.note
