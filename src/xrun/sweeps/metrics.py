"""A sweep's trials compared: the numeric metadata each trial's run recorded, for the columns
of ``xrun status SWEEP`` (``--sort KEY``, ``--desc``).

A trial's run is found as a child of the sweep's (``run_ids(parent_run_id=SWEEP)``, its index
in its ``sweep.trial`` metadata), else by the trial's own handle (a Slurm array's tasks, which
have no parent). xrun's own keys (``attempt.*``, ``restart_count``, ``sweep.*``) are no metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xrun.errors import UsageError

if TYPE_CHECKING:
    from xrun.sweeps.status import TrialStatus
    from xrun.tracker.base import TrackerBase

_OWN_PREFIXES = ("attempt.", "sweep.")
_OWN_KEYS = ("restart_count", "slurm_restart_count")
# The longest a status waits for the tracker's answer (MLflow: two requests per trial).
READ_TIMEOUT_S = 30.0


def numeric(md: dict[str, object]) -> dict[str, float]:
    """The metadata that are finite numbers (not bools) and no key of xrun's own."""
    out = {}
    for k, v in md.items():
        if k in _OWN_KEYS or k.startswith(_OWN_PREFIXES) or isinstance(v, bool):
            continue
        if not isinstance(v, int | float):
            continue
        try:
            number = float(v)  # a JSON integer may be 10**400: no float (P6)
        except OverflowError:
            continue
        if math.isfinite(number):
            out[k] = number
    return out


def trial_metrics(
    sweep_handle: str,
    trials: Sequence[TrialStatus],
    tracker: TrackerBase | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[int, dict[str, float]]:
    """Trial index -> its numeric metadata; {} when nothing is tracked or tracking is off.
    When the tracker cannot be read (unreachable, failing, or no answer within
    READ_TIMEOUT_S), the table is shown without metric columns and ``warn`` is told why."""
    if tracker is None:
        # benchmark 10: a sweep's status reads the tracker only when asked for its table
        from xrun.tracker.query import TrackingOff
        from xrun.tracker.query import tracker as configured

        try:
            tracker = configured()
        except TrackingOff:
            return {}
        except (UsageError, OSError, ImportError, ValueError) as e:
            _left_out(warn, e)
            return {}
    # kept off a status without a table (benchmark 10)
    from xrun.tracker import guard

    try:
        if guard.is_local(tracker):
            return _read(sweep_handle, trials, tracker)
        return dict(guard.within(READ_TIMEOUT_S, _read, sweep_handle, trials, tracker))
    except Exception as e:  # any backend's failure: the table without metric columns
        _left_out(warn, e)
        return {}


def _left_out(warn: Callable[[str], None] | None, err: BaseException) -> None:
    if warn is not None:
        from xrun.tracker.guard import describe

        warn(f"metric columns left out: the tracker could not be read ({describe(err)})")


def _read(
    sweep_handle: str, trials: Sequence[TrialStatus], tracker: TrackerBase
) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for run_id in tracker.run_ids(parent_run_id=sweep_handle):
        md = dict(tracker.metadata(run_id))
        index = md.get("sweep.trial")
        if isinstance(index, int) and not isinstance(index, bool):
            out[index] = numeric(md)
    scheme, _, rest = sweep_handle.partition("://")
    session = rest.partition("/")[0]
    for t in trials:
        if t.index not in out and t.app_id:
            found = numeric(dict(tracker.metadata(f"{scheme}://{session}/{t.app_id}")))
            if found:
                out[t.index] = found
    return {i: m for i, m in out.items() if m}


def sort_trials(
    trials: list[TrialStatus],
    metrics: dict[int, dict[str, float]],
    params: Sequence[str],
    key: str,
    desc: bool = False,
) -> list[TrialStatus]:
    """``trials`` ordered by a metric or a parameter ``key``; trials without it last."""
    keys = sorted({k for m in metrics.values() for k in m})
    if key not in keys and key not in params:
        raise UsageError(
            f"--sort {key or repr(key)}: no metric or parameter of this sweep by that name; valid: "
            f"{', '.join([*params, *keys]) or 'none (no trial recorded numeric metadata yet)'}"
        )

    def value(t: TrialStatus) -> tuple[int, float | str] | None:
        if key in params:
            text = t.values.get(key, "")
            try:
                return 0, float(text)
            except ValueError:
                return 1, text
        m = metrics.get(t.index, {})
        return (0, m[key]) if key in m else None

    present = [t for t in trials if value(t) is not None]
    missing = [t for t in trials if value(t) is None]
    return sorted(present, key=lambda t: value(t) or (0, 0.0), reverse=desc) + missing


def columns(metrics: dict[int, dict[str, float]]) -> list[str]:
    """The metric columns, by name."""
    return sorted({k for m in metrics.values() for k in m})


def cell(metrics: dict[int, dict[str, float]], index: int, key: str) -> str:
    value = metrics.get(index, {}).get(key)
    return "" if value is None else format(value, "g")
