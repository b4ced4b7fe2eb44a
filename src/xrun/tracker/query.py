"""Reading tracked runs from the launching side: what ``xrun tracker list ...`` prints.

The tracker read is the first one configured (``[torchx:tracker]`` of ``.xrunconfig`` or
``TORCHX_TRACKERS``, as TorchX's ``torchx tracker`` does), else the embedded default under
xrun's state dir::

    from xrun.tracker.query import list_jobs, list_metadata, list_artifacts

    for job in list_jobs():
        print(job, list_metadata(job))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xrun.errors import UsageError

if TYPE_CHECKING:
    from xrun.config import Config
    from xrun.tracker.api import TrackerArtifact, TrackerBase


def tracker(config: Config | None = None) -> TrackerBase:
    """The tracker the launching side reads (see the module's docstring)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.config import load
    from xrun.tracker.check import check_trackers
    from xrun.tracker.resolve import build
    from xrun.tracking import configured

    found = configured(config if config is not None else load())
    if found is None:  # the embedded default, read as it is (nothing created by a read)
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        from xrun.tracker.fsspec_backend import read_only_default

        return read_only_default()
    if not found:
        raise UsageError(
            "tracking is turned off (an empty [torchx:tracker] section or TORCHX_TRACKERS=); "
            "name a tracker there, e.g. [torchx:tracker] fsspec = with [tracker:fsspec] "
            "config = DIR"
        )
    first = found[0]
    check_trackers([first])
    try:
        return build(first.name, first.config)
    except (ImportError, ValueError, OSError) as e:  # e.g. a root that cannot be created
        raise UsageError(
            f"{first.name_source}: tracker {first.name!r} cannot be used: {e}"
        ) from None


def list_jobs(parent_run_id: str | None = None, config: Config | None = None) -> list[str]:
    """The job (run) ids tracked; ``parent_run_id``: only its children."""
    t = tracker(config)
    if parent_run_id:
        return list(t.run_ids(parent_run_id=parent_run_id))
    return list(t.run_ids())


def list_metadata(job_id: str, config: Config | None = None) -> dict[str, object]:
    return dict(tracker(config).metadata(job_id))


def list_artifacts(
    job_id: str, artifact: str | None = None, config: Config | None = None
) -> list[TrackerArtifact]:
    found = list(tracker(config).artifacts(job_id).values())
    return [a for a in found if not artifact or a.name == artifact]
