"""A sweep's status: one row per trial, and the table ``xrun status`` prints.

Every scheduler's sweep backend answers with a :class:`SweepStatus`; the sweep's own state is
folded from its trials' (:func:`fold_state`): it has ended once no trial is waiting or running,
and it failed when any trial did (a failed trial never stops the others).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from xrun.specs import AppState

# A trial in one of these may still change.
LIVE = frozenset({AppState.UNSUBMITTED, AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING})
# Column order of the counts (the order a trial moves through).
_ORDER = (
    AppState.SUCCEEDED,
    AppState.FAILED,
    AppState.CANCELLED,
    AppState.RUNNING,
    AppState.PENDING,
    AppState.SUBMITTED,
    AppState.UNSUBMITTED,
    AppState.UNKNOWN,
)
# How many failed trials' messages the table lists under itself.
_MAX_ERRORS = 20


@dataclass
class TrialStatus:
    """One trial: its values, its state, and where and how long it ran.

    ``app_id``: what the scheduler calls it (local_cwd/docker: the trial's own app; slurm: the
    array task, ``JOBID_INDEX``). ``started``/``ended``: epoch seconds, None when unknown.
    """

    index: int
    values: dict[str, str]
    state: AppState = AppState.PENDING
    exit_code: int | None = None
    host: str = ""
    started: float | None = None
    ended: float | None = None
    app_id: str = ""
    msg: str = ""

    def duration(self, now: float | None = None) -> float | None:
        if self.started is None:
            return None
        end = self.ended if self.ended is not None else (now or time.time())
        return max(0.0, end - self.started)


def fold_state(states: list[AppState]) -> AppState:
    """The sweep's state from its trials' (see the module doc)."""
    if any(s in LIVE for s in states):
        started = any(
            s not in (AppState.PENDING, AppState.SUBMITTED, AppState.UNSUBMITTED) for s in states
        )
        return AppState.RUNNING if started else AppState.PENDING
    for s in (AppState.FAILED, AppState.UNKNOWN, AppState.CANCELLED):
        if s in states:
            return s
    return AppState.SUCCEEDED


@dataclass
class SweepStatus:
    """A sweep: its handle, parameters and trials. ``msg``: what the backend wants said."""

    handle: str
    name: str
    params: list[str]
    trials: list[TrialStatus] = field(default_factory=list)
    max_parallel: int | None = None
    msg: str = ""
    # trial index -> the numeric metadata its tracker run recorded (xrun.sweeps.metrics):
    # one column per key, between duration and id
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def state(self) -> AppState:
        # No trials: a sweep whose record could not be read (every real sweep has one).
        return fold_state([t.state for t in self.trials]) if self.trials else AppState.UNKNOWN

    def is_terminal(self) -> bool:
        return all(t.state not in LIVE for t in self.trials)

    def counts(self) -> dict[AppState, int]:
        """Trials per state, in :data:`_ORDER`, states with none left out."""
        out = {s: 0 for s in _ORDER}
        for t in self.trials:
            out[t.state] = out.get(t.state, 0) + 1
        return {s: n for s, n in out.items() if n}

    def summary(self) -> str:
        """``6 trials: 2 SUCCEEDED, 1 FAILED, 3 RUNNING``."""
        parts = ", ".join(f"{n} {s.name}" for s, n in self.counts().items())
        return f"{len(self.trials)} trials: {parts}" if parts else "0 trials"

    def format(self, now: float | None = None) -> str:
        """What ``xrun status`` prints: the state, the counts, then one row per trial."""
        now = now or time.time()
        head = [f"State: {self.state.name}", f"Trials: {self.summary()}"]
        if self.max_parallel:
            head.append(f"At most {self.max_parallel} trial(s) at once")
        if self.msg:
            head.append(f"Msg: {self.msg}")
        keys = sorted({k for m in self.metrics.values() for k in m})
        cols = ["trial", *self.params, "state", "exit", "host", "duration", *keys, "id"]
        rows = [
            [
                str(t.index),
                *(t.values.get(p, "") for p in self.params),
                t.state.name,
                "" if t.exit_code is None else str(t.exit_code),
                t.host,
                format_duration(t.duration(now)),
                *(_metric(self.metrics.get(t.index, {}).get(k)) for k in keys),
                t.app_id,
            ]
            for t in self.trials
        ]
        widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(cols)]
        exit_col = len(self.params) + 2
        # trial, exit, duration and the metrics: right-aligned
        numeric = {0, exit_col, *range(exit_col + 2, exit_col + 3 + len(keys))}
        lines = head + [_row(cols, widths, numeric)] + [_row(r, widths, numeric) for r in rows]
        errors = [t for t in self.trials if t.msg and t.state == AppState.FAILED]
        for t in errors[:_MAX_ERRORS]:
            lines.append(f"trial {t.index}: {t.msg.splitlines()[0][:300]}")
        if len(errors) > _MAX_ERRORS:
            lines.append(f"... and {len(errors) - _MAX_ERRORS} more failed trial(s)")
        return "\n".join(lines)


def _metric(value: float | None) -> str:
    return "" if value is None else format(value, "g")


def _row(cells: list[str], widths: list[int], numeric: set[int]) -> str:
    out = [
        c.rjust(w) if i in numeric else c.ljust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(out).rstrip()


def format_duration(seconds: float | None) -> str:
    """``3.2s``, ``4m05s``, ``2h03m``; "" when unknown."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
