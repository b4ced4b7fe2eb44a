"""Reading tracked runs from the launching side: what ``xrun tracker list ...`` prints.

The tracker read is the first one configured (``[torchx:tracker]`` of ``.xrunconfig`` or
``TORCHX_TRACKERS``, as TorchX's ``torchx tracker`` does), else the embedded default under
xrun's state dir::

    from xrun.tracker.query import list_jobs, list_metadata, list_artifacts

    for job in list_jobs():
        print(job, list_metadata(job))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xrun.errors import AppNotFoundError, SchedulerError, UsageError

# The longest a read (``xrun tracker list``) waits for a tracker that is no local dir.
READ_TIMEOUT_S = 30.0

if TYPE_CHECKING:
    from xrun.config import Config
    from xrun.tracker.api import TrackerArtifact, TrackerBase


class TrackingOff(UsageError):
    """Tracking is turned off: there is no tracker to read."""


def tracker(config: Config | None = None) -> TrackerBase:
    """The tracker the launching side reads (see the module's docstring)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.config import load
    from xrun.tracker.check import check_trackers
    from xrun.tracker.resolve import build
    from xrun.tracker.submit import configured

    found = configured(config if config is not None else load())
    if found is None:  # the embedded default, read as it is (nothing created by a read)
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        from xrun.tracker.fsspec_backend import read_only_default

        return read_only_default()
    if not found:
        raise TrackingOff(
            "tracking is turned off (an empty [torchx:tracker] section or TORCHX_TRACKERS=); "
            "name a tracker there, e.g. [torchx:tracker] fsspec = with [tracker:fsspec] "
            "config = DIR"
        )
    first = found[0]
    check_trackers([first])
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.guard import _NAMES, mask

    try:
        built = build(first.name, first.config)
    except (ImportError, ValueError, OSError) as e:  # e.g. a root that cannot be created
        raise UsageError(
            f"{first.name_source}: tracker {first.name!r} cannot be used: {mask(str(e))}"
        ) from None
    _NAMES[id(built)] = first.name
    return built


def list_jobs(parent_run_id: str | None = None, config: Config | None = None) -> list[str]:
    """The job (run) ids tracked; ``parent_run_id``: only its children."""
    t = tracker(config)
    if parent_run_id:
        return list(_read(t, lambda: t.run_ids(parent_run_id=parent_run_id)))
    return list(_read(t, t.run_ids))


def list_metadata(job_id: str, config: Config | None = None) -> dict[str, object]:
    t = tracker(config)
    return dict(_read(t, lambda: _known(t, job_id) and t.metadata(job_id)))


def list_artifacts(
    job_id: str, artifact: str | None = None, config: Config | None = None
) -> list[TrackerArtifact]:
    t = tracker(config)
    found = list(_read(t, lambda: _known(t, job_id) and t.artifacts(job_id)).values())
    return [a for a in found if not artifact or a.name == artifact]


def _known(t: TrackerBase, job_id: str) -> bool:
    """True, or AppNotFoundError: a run id the tracker has no run of (M10)."""
    has_run = getattr(t, "has_run", None)
    if has_run(job_id) if callable(has_run) else job_id in t.run_ids():
        return True
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.guard import label

    raise AppNotFoundError(
        f"{label(t)} has no run {job_id!r}; a run id is a job's handle "
        "(SCHEDULER://SESSION/APP_ID): xrun tracker list jobs lists them"
    )


def _read(t: TrackerBase, read: Callable[[], Any]) -> Any:
    """``read()`` of tracker ``t``, within READ_TIMEOUT_S unless ``t`` is a local dir; its
    failure (an unreachable or hung server) as one line, exit 1."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker import guard

    try:
        return read() if guard.is_local(t) else guard.within(READ_TIMEOUT_S, read)
    except (AppNotFoundError, UsageError):
        raise
    except Exception as e:  # any backend's failure, on one line
        raise SchedulerError(f"{guard.label(t)} could not be read: {guard.describe(e)}") from None
