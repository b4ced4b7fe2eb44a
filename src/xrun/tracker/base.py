"""The types of TorchX 0.7.0's tracker API (``torchx.tracker.api``): a backend's interface
(:class:`TrackerBase`) and the values it returns.

Plain classes, not dataclasses: ``import dataclasses`` (it pulls in ``inspect``) alone costs
about two thirds of the import budget a worker has for ``xrun.tracker``
(tests/core/tracker/test_cost.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping

from xrun.contract import JOB_ID_ENV, PARENT_RUN_ID_ENV, TRACKERS_ENV, tracker_config_env
from xrun.record import Record

# TorchX's API names for the variables xrun.contract owns.
ENV_TORCHX_TRACKERS = TRACKERS_ENV
ENV_TORCHX_PARENT_RUN_ID = PARENT_RUN_ID_ENV
ENV_TORCHX_JOB_ID = JOB_ID_ENV
UNDEFINED = "<UNDEFINED>"  # TorchX's job id for a process no launcher started


class TrackerSource(Record):
    """A source of a run as a backend stores it: another run's id (or any external id), and
    the kind of relation (``artifact_name``), which filters."""

    _fields = ("source_run_id", "artifact_name")

    def __init__(self, source_run_id: str, artifact_name: str | None) -> None:
        self.source_run_id = source_run_id
        self.artifact_name = artifact_name


class TrackerArtifact(Record):
    """An artifact as a backend stores it: a name, a path, optional metadata."""

    _fields = ("name", "path", "metadata")

    def __init__(self, name: str, path: str, metadata: Mapping[str, object] | None) -> None:
        self.name = name
        self.path = path
        self.metadata = metadata


class Lineage:
    """TorchX 0.7.0 declares it and no backend implements it."""


class TrackerBase(ABC):
    """A tracking backend: persists metadata, artifacts and sources per run id."""

    @abstractmethod
    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None: ...

    @abstractmethod
    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]: ...

    @abstractmethod
    def add_metadata(self, run_id: str, **kwargs: object) -> None: ...

    @abstractmethod
    def metadata(self, run_id: str) -> Mapping[str, object]: ...

    @abstractmethod
    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None: ...

    @abstractmethod
    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]: ...

    @abstractmethod
    def lineage(self, run_id: str) -> Lineage: ...

    @abstractmethod
    def run_ids(self, **kwargs: str) -> Iterable[str]: ...


def tracker_config_env_var_name(entrypoint_key: str) -> str:
    """``TORCHX_TRACKER_<NAME>_CONFIG``: where a tracker's config travels to the job."""
    return tracker_config_env(entrypoint_key)
