"""The tracker API of TorchX 0.7.0 (``torchx.tracker.api``), as xrun provides it.

A job's code gets its run with :func:`app_run_from_env` and records into it; each configured
backend (a :class:`~xrun.tracker.base.TrackerBase`) persists what it is given. The run's id is
the job's handle (``TORCHX_JOB_ID``), which xrun keeps the same across the agent's in-place
restarts, Slurm requeues and docker retries: one run per logical job, however often it starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from xrun.tracker.base import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    UNDEFINED,
    Lineage,
    Record,
    TrackerArtifact,
    TrackerBase,
    TrackerSource,
    tracker_config_env_var_name,
)

__all__ = [
    "ENV_TORCHX_JOB_ID",
    "ENV_TORCHX_PARENT_RUN_ID",
    "ENV_TORCHX_TRACKERS",
    "AppRun",
    "AppRunTrackableSource",
    "Lineage",
    "TrackerArtifact",
    "TrackerBase",
    "TrackerSource",
    "app_run_from_env",
    "build_trackers",
    "tracker_config_env_var_name",
    "trackers_from_environ",
]


class AppRunTrackableSource(Record):
    """A source as :meth:`AppRun.sources` gives it: the parent run and the relation."""

    _fields = ("parent", "artifact_name")

    def __init__(self, parent: AppRun, artifact_name: str | None) -> None:
        self.parent = parent
        self.artifact_name = artifact_name


def build_trackers(factory_and_config: Mapping[str, str | None]) -> list[TrackerBase]:
    """One backend per ``name -> config`` (see :mod:`xrun.tracker.resolve` for the names)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.resolve import build

    return [build(name, config) for name, config in factory_and_config.items()]


def trackers_from_environ() -> list[TrackerBase]:
    """The backends the job's environment names (``TORCHX_TRACKERS``; with none named in a job
    xrun started, the embedded default under xrun's state dir)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.resolve import from_environ

    return from_environ(os.environ)


class AppRun:
    """A job's run: what it records goes to every backend; reads use the first."""

    def __init__(self, id: str, backends: Iterable[TrackerBase]) -> None:
        self.id = id
        self.backends = list(backends)

    def __repr__(self) -> str:
        return f"AppRun(id={self.id!r}, backends={self.backends!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AppRun) and (self.id, self.backends) == (
            other.id,
            other.backends,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like TorchX's dataclass

    @staticmethod
    def run_from_env() -> AppRun:
        """The process's run, built once (the same backends for every call)."""
        global _RUN
        if _RUN is None:
            _RUN = _from_env()
        return _RUN

    def add_metadata(self, **kwargs: object) -> None:
        for backend in self.backends:
            backend.add_metadata(self.id, **kwargs)

    def add_artifact(
        self, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        for backend in self.backends:
            backend.add_artifact(self.id, name, path, metadata)

    def job_id(self) -> str:
        return self.id

    def add_source(self, source_id: str, artifact_name: str | None = None) -> None:
        for backend in self.backends:
            backend.add_source(self.id, source_id, artifact_name)

    def sources(self) -> list[AppRunTrackableSource]:
        if not self.backends:
            return []
        return [
            AppRunTrackableSource(AppRun(s.source_run_id, self.backends), s.artifact_name)
            for s in self.backends[0].sources(self.id)
        ]

    def children(self) -> Iterable[AppRun]:
        """Declared by TorchX 0.7.0, not implemented there either."""
        raise NotImplementedError("AppRun.children: not in TorchX 0.7.0's API either")


_RUN: AppRun | None = None


def _from_env() -> AppRun:
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker import attempts

    env = os.environ
    job_id = env.get(ENV_TORCHX_JOB_ID, UNDEFINED)
    run = AppRun(job_id, trackers_from_environ())
    parent = env.get(ENV_TORCHX_PARENT_RUN_ID)
    if parent and run.backends:
        # Written again by every start of the job: a source is a name, so it stays one entry.
        run.add_source(parent)
    if run.backends and attempts.is_recorder(env):
        run.add_metadata(**attempts.metadata(env))
    return run


def app_run_from_env() -> AppRun:
    """The run of the job this process belongs to (TorchX's ``app_run_from_env``)."""
    return AppRun.run_from_env()


def _reset_for_tests() -> None:
    """Forget the cached run (a test changes the environment between two runs)."""
    global _RUN
    _RUN = None
