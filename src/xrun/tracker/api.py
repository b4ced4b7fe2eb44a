"""The tracker API of TorchX 0.7.0 (``torchx.tracker.api``), as xrun provides it.

A job's code gets its run with :func:`app_run_from_env` and records into it; each configured
backend (a :class:`~xrun.tracker.base.TrackerBase`) persists what it is given. The run's id is
the job's handle (``TORCHX_JOB_ID``), which xrun keeps the same across the agent's in-place
restarts, Slurm requeues and docker retries: one run per logical job, however often it starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

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
        # where the calls of a dropped backend go (xrun.tracker.guard.unsent_root)
        self._unsent: TrackerBase | None = None
        self._unsent_root = ""
        self._unsent_tried = False
        self._unsent_error = ""

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
        self._each(lambda b: b.add_metadata(self.id, **kwargs))

    def add_artifact(
        self, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self._each(lambda b: b.add_artifact(self.id, name, path, metadata))

    def job_id(self) -> str:
        return self.id

    def add_source(self, source_id: str, artifact_name: str | None = None) -> None:
        self._each(lambda b: b.add_source(self.id, source_id, artifact_name))

    def sources(self) -> list[AppRunTrackableSource]:
        while self.backends:
            first = self.backends[0]
            try:
                found = _call(first, lambda b: list(b.sources(self.id)))
                assert isinstance(found, list)
            except Exception as e:  # a backend's failure: reported, dropped, never raised
                self._drop([(first, e)], None)
                continue
            return [
                AppRunTrackableSource(AppRun(s.source_run_id, self.backends), s.artifact_name)
                for s in found
            ]
        return []

    def _each(self, call: Callable[[TrackerBase], object]) -> None:
        """``call`` on every backend; one that raises or does not answer in time is reported
        once and dropped, and what it could not take is kept locally (xrun.tracker.guard)."""
        failed = []
        for backend in list(self.backends):
            try:
                _call(backend, call)
            except Exception as e:  # any backend's failure: reported, never raised
                failed.append((backend, e))
        if failed or self._unsent is not None:
            self._drop(failed, call)

    def _drop(
        self,
        failed: list[tuple[TrackerBase, Exception]],
        call: Callable[[TrackerBase], object] | None,
    ) -> None:
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        from xrun.tracker import guard

        for backend, _ in failed:
            self.backends.remove(backend)
        if failed and self._unsent is None and not self._unsent_tried:
            self._unsent_tried = True
            root = guard.unsent_root(failed[0][0])
            if root is not None:
                from xrun.tracker.fsspec_backend import create

                try:
                    self._unsent, self._unsent_root = create(root), root
                except Exception as e:  # the local copy too: said on the line below
                    self._unsent_error = guard.describe(e)
        kept = ""
        if self._unsent is not None and call is not None:
            try:
                call(self._unsent)
                kept = f"what it could not take is kept under {self._unsent_root}"
            except Exception as e:
                kept = f"the local copy under {self._unsent_root} failed too ({guard.describe(e)})"
                self._unsent = None
                if not failed:
                    guard.say(f"{kept}; nothing more is kept")
        elif self._unsent_error:
            kept = f"the local copy failed too ({self._unsent_error})"
        for backend, err in failed:
            tail = f"; {kept}" if kept else "; nothing of it is kept"
            guard.say(
                f"{guard.label(backend)} dropped for the rest of this process: "
                f"{guard.describe(err)}{tail}"
            )

    def children(self) -> Iterable[AppRun]:
        """Declared by TorchX 0.7.0, not implemented there either."""
        raise NotImplementedError("AppRun.children: not in TorchX 0.7.0's API either")


_RUN: AppRun | None = None


def _call(backend: TrackerBase, call: Callable[[TrackerBase], object]) -> object:
    """``call(backend)``: inline on a local dir, else within the deadline (TrackerTimeout)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker import guard

    if guard.is_local(backend):
        return call(backend)
    return guard.within(guard.timeout_s(), call, backend)


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
