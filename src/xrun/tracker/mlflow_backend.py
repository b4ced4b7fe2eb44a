"""The ``mlflow`` tracker backend (``pip install 'xrun[mlflow]'``): one MLflow run per job.

Config: the tracking URI, optionally ``#EXPERIMENT`` (``http://127.0.0.1:5000#my-exp``; none:
MLflow's default, ``MLFLOW_TRACKING_URI`` or ``./mlruns``); the
experiment defaults to the job's ``TORCHX_TRACKING_EXPERIMENT_NAME`` (``dist.ddp --name
EXP/RUN``), else ``xrun``. The job's id (its handle) is the MLflow run's tag ``xrun.job_id``: the
run is found by it, so a restarted or requeued job writes into the run it started.

Workers of one job may create its run at the same moment: each keeps the earliest it sees and
deletes its own otherwise. A run whose creation was still on its way to the server can show up
later with an earlier start, so workers may have written into a run that is deleted, or that
is not the earliest, by then. So a job's runs are read as one: its earliest active run (the
*main* one) says what it holds, and every other run with the job's tag, deleted ones included,
adds what the main one lacks (sources: all of them); a writer whose run was deleted meanwhile
writes again into the main one.

- metadata: MLflow params (a key's first value; params cannot change) and tags (a later value
  of the same key); read back with the tags winning, JSON values decoded;
- artifacts: the file or dir at the path is uploaded under the artifact's name, and the name,
  path and metadata are kept in the tag ``xrun.artifact.<name>`` (a name too long for a key:
  its start and a hash of it);
- sources: the first becomes the MLflow parent run (``mlflow.parentRunId``; the parent's run is
  created when missing, so a sweep's trials are child runs of one sweep run); each is kept in a
  tag of its own, ``xrun.source.<hash of source and artifact name>``, holding the source, the
  artifact name and when it was added (read back in that order). One tag per source, not one
  list: two workers adding sources at once would each rewrite the list they read, and the
  later write would drop the other's source. Runs written before keep theirs in the one tag
  ``xrun.sources`` (a JSON list), still read, first.

MLflow allows letters, digits and ``_-. /`` in keys; any other character becomes ``_``. A tag
value holds at most 8000 characters (a store cuts a longer one short, or refuses it): what would
not fit is not written, and one stderr line says so: a source (no job id MLflow can hold is that
long), an artifact's metadata (the artifact is kept without it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from xrun.contract import EXPERIMENT_ENV
from xrun.tracker.base import Lineage, TrackerArtifact, TrackerBase, TrackerSource

JOB_TAG = "xrun.job_id"
SOURCES_TAG = "xrun.sources"  # the list of sources older runs hold (read, no longer written)
SOURCE_TAG = "xrun.source."
ARTIFACT_TAG = "xrun.artifact."
DEFAULT_EXPERIMENT = "xrun"
# MLflow's limits (mlflow.utils.validation): a store cuts a longer tag value short
# (MLFLOW_TRUNCATE_LONG_VALUES, the default) or refuses it, and refuses a longer key.
MAX_TAG_VALUE = 8000
MAX_KEY = 250
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def parse_config(config: str | None) -> tuple[str | None, str]:
    """(tracking URI, experiment) from ``URI[#EXPERIMENT]``; no URI: MLflow's own default
    (``MLFLOW_TRACKING_URI``, else ``./mlruns``)."""
    uri, _, experiment = (config or "").strip().partition("#")
    return uri or None, experiment or os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT


def _key(name: str) -> str:
    return _BAD_KEY.sub("_", name)[:250] or "_"


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _source_tag(source_id: str, artifact_name: str | None) -> str:
    """The tag of one source: the same key for the same pair, whichever worker adds it."""
    digest = hashlib.sha256(json.dumps([source_id, artifact_name]).encode()).hexdigest()
    return SOURCE_TAG + digest[:32]


def _run_sources(tags: Mapping[str, str]) -> list[list[Any]]:
    """A run's ``[source, artifact name]`` pairs: the old list tag's, then the tags of one
    source each in the order they were added (ties: by key, one order for every reader)."""
    pairs: list[list[Any]] = [list(p) for p in json.loads(tags.get(SOURCES_TAG, "[]"))]
    added = []
    for key, text in tags.items():
        if key.startswith(SOURCE_TAG):
            entry = _value(text)
            # One that does not read (cut short by a store's value limit, set by hand) is left
            # out: the run's other sources still read, and more can be added.
            if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], int):
                source, artifact, at = entry
                added.append((at, key, [source, artifact]))
    return pairs + [pair for _, _, pair in sorted(added)]


def _artifact_tag(name: str) -> str:
    """The tag of artifact ``name``: ``xrun.artifact.<name>``, the whole key within MLflow's
    limit; a longer one ends in a hash of the whole name instead, so two long names that
    begin alike keep a tag each. (Written before as the name cut to 250: a key over the
    limit, which MLflow refused, or a store without the check took; still read.)"""
    key = ARTIFACT_TAG + _key(name)
    if len(key) <= MAX_KEY:
        return key
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    return key[: MAX_KEY - len(digest) - 1] + "." + digest


def _artifact(text: str) -> TrackerArtifact | None:
    """The artifact an ``xrun.artifact.*`` tag holds, or None for one that does not read (cut
    short by a store's value limit, set by hand): left out, so the run's others still read."""
    e = _value(text)
    if not isinstance(e, dict):
        return None
    name, path, metadata = e.get("name"), e.get("path"), e.get("metadata")
    if not (isinstance(name, str) and isinstance(path, str)):
        return None
    if metadata is not None and not isinstance(metadata, dict):
        return None
    return TrackerArtifact(name, path, metadata)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _too_long(backend: object, text: str, what: str) -> bool:
    """Whether ``text`` is over MLflow's limit for a tag value; if so, one stderr line saying
    that ``what`` is not recorded. A store would cut it short (then it does not read back) or
    refuse it (an error, which drops the backend for the rest of the process)."""
    if len(text) <= MAX_TAG_VALUE:
        return False
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.guard import label, say

    say(
        f"{label(backend)}: {what} not recorded: its tag would hold {len(text)} characters, "
        f"over MLflow's limit of {MAX_TAG_VALUE} for a tag value"
    )
    return True


class MLflowTracker(TrackerBase):
    def __init__(self, tracking_uri: str | None, experiment: str) -> None:
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self._experiment_name = experiment
        self._experiment_id: str | None = None
        self._ids: dict[str, str] = {}  # job id -> MLflow run id

    @property
    def experiment_id(self) -> str:
        """Looked up (or created) on first use, not when the backend is built: building one
        in a job touches no network, and the first call runs within the job's deadline for
        tracker calls (xrun.tracker.guard)."""
        if self._experiment_id is None:
            self._experiment_id = self._experiment(self._experiment_name)
        return self._experiment_id

    def __repr__(self) -> str:
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        from xrun.tracker.guard import mask

        return f"<MLflowTracker: {mask(str(self.uri))} experiment={self._experiment_name}>"

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:  # another worker created it first
            again = self.client.get_experiment_by_name(name)
            if again is None:
                raise
            return str(again.experiment_id)

    def _find(self, job_id: str) -> str | None:
        if job_id in self._ids:
            return self._ids[job_id]
        # the earliest run with the job's tag (created first, then by run id: one order for all)
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{JOB_TAG}` = {_quoted(job_id)}",
            max_results=1,
            order_by=["attributes.start_time ASC", "attributes.run_id ASC"],
        )
        if runs:
            self._ids[job_id] = runs[0].info.run_id
        return self._ids.get(job_id)

    def _runs(self, job_id: str) -> list[Any]:
        """Every run with the job's tag, deleted ones too: the main one (the earliest active)
        first, then the others earliest first."""
        from mlflow.entities import ViewType

        runs: list[Any] = []
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{JOB_TAG}` = {_quoted(job_id)}",
                run_view_type=ViewType.ALL,
                order_by=["attributes.start_time ASC", "attributes.run_id ASC"],
                page_token=token,
            )
            runs += list(page)
            token = page.token
            if not token:
                break
        main = next((r for r in runs if r.info.lifecycle_stage == "active"), None)
        if main is None:
            return runs
        return [main] + [r for r in runs if r.info.run_id != main.info.run_id]

    def _write(self, job_id: str, write: Callable[[str], None]) -> None:
        """``write(run id)`` into the job's run; again into the main one when another worker
        deleted ours meanwhile (MLflow refuses writes to a deleted run)."""
        rid = self._run(job_id)
        try:
            write(rid)
        except Exception:
            try:
                active = self.client.get_run(rid).info.lifecycle_stage == "active"
            except Exception:  # noqa: BLE001 - gone for good (`mlflow gc`): as deleted
                active = False
            if active:
                raise
            self._ids.pop(job_id, None)
            write(self._run(job_id))

    def _run(self, job_id: str) -> str:
        found = self._find(job_id)
        if found is not None:
            return found
        run = self.client.create_run(
            self.experiment_id, tags={JOB_TAG: job_id}, run_name=_key(job_id.rpartition("/")[2])
        )
        # Workers of one job may create its run at the same moment: all keep the earliest, the
        # others delete theirs, so the job still has one run.
        first = self._find(job_id)
        if first != run.info.run_id:
            self.client.delete_run(run.info.run_id)
        return str(first)

    # ------------------------------------------------------------------ metadata
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        from mlflow.entities import Param, RunTag

        def write(rid: str) -> None:
            params = self.client.get_run(rid).data.params
            new, changed = [], []
            for k, v in kwargs.items():
                key, text = _key(k), _text(v)
                if key not in params:
                    new.append(Param(key, text))
                elif params[key] != text:
                    changed.append(RunTag(key, text))
            if new or changed:
                self.client.log_batch(rid, params=new, tags=changed)

        self._write(run_id, write)

    def metadata(self, run_id: str) -> dict[str, object]:
        out: dict[str, object] = {}
        for run in reversed(self._runs(run_id)):  # the main run last: its values win
            data = run.data
            out.update({k: _value(v) for k, v in data.params.items()})
            out.update({k: _value(v) for k, v in data.tags.items() if k in data.params})
        return out

    # ------------------------------------------------------------------ artifacts
    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        entry = {"name": name, "path": path, "metadata": dict(metadata) if metadata else metadata}
        text = json.dumps(entry, default=str)
        if metadata and _too_long(self, text, f"the metadata of artifact {name!r:.100}"):
            text = json.dumps({**entry, "metadata": None})  # the artifact itself still reads
        if _too_long(self, text, f"artifact {name!r:.100}"):
            return

        def write(rid: str) -> None:
            if os.path.isdir(path):
                self.client.log_artifacts(rid, path, artifact_path=_key(name))
            elif os.path.isfile(path):
                self.client.log_artifact(rid, path, artifact_path=_key(name))
            self.client.set_tag(rid, _artifact_tag(name), text)

        self._write(run_id, write)

    def artifacts(self, run_id: str) -> dict[str, TrackerArtifact]:
        found: dict[str, str] = {}
        for run in reversed(self._runs(run_id)):  # the main run last: its entries win
            found.update({k: v for k, v in run.data.tags.items() if k.startswith(ARTIFACT_TAG)})
        out: dict[str, TrackerArtifact] = {}
        for key, text in sorted(found.items()):
            artifact = _artifact(text)
            if artifact is None:
                continue
            # a long name's tag under the key of old and of now: the key of now (newer) wins
            if artifact.name not in out or key == _artifact_tag(artifact.name):
                out[artifact.name] = artifact
        return out

    # ------------------------------------------------------------------ sources
    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        text = json.dumps([source_id, artifact_name, time.time_ns()])
        # Left out, not kept elsewhere: a source is a job id, found by the job tag of its own
        # run, under the same limit; a longer one is no job MLflow can hold (its parent run
        # would be created under a job tag cut short, found by nobody).
        if _too_long(self, text, f"source {source_id!r:.100} of {run_id}"):
            return

        def write(rid: str) -> None:
            tags = self.client.get_run(rid).data.tags
            if [source_id, artifact_name] not in _run_sources(tags):
                self.client.set_tag(rid, _source_tag(source_id, artifact_name), text)
            if "mlflow.parentRunId" not in tags:
                self.client.set_tag(rid, "mlflow.parentRunId", self._run(source_id))

        self._write(run_id, write)

    def sources(self, run_id: str, artifact_name: str | None = None) -> list[TrackerSource]:
        known: list[list[Any]] = []
        for run in self._runs(run_id):  # the main run's first
            for pair in _run_sources(run.data.tags):
                if pair not in known:
                    known.append(pair)
        return [TrackerSource(s, a) for s, a in known if not artifact_name or a == artifact_name]

    def has_run(self, run_id: str) -> bool:
        """Whether a run carries that job id (xrun's addition, for ``tracker list``)."""
        return self._find(run_id) is not None

    def run_ids(self, **kwargs: str) -> list[str]:
        parent = kwargs.get("parent_run_id")
        query = f"tags.`{JOB_TAG}` LIKE '%'"
        parents: set[str] = set()
        if parent:  # a child may name any of its parent job's runs (see the module docstring)
            parents = {r.info.run_id for r in self._runs(parent)}
            if not parents:
                return []
        out: list[str] = []
        seen: set[str] = set()
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=query,
                max_results=1000,
                order_by=["attributes.start_time ASC"],
                page_token=token,
            )
            for r in page:
                job = r.data.tags[JOB_TAG]
                child = not parents or r.data.tags.get("mlflow.parentRunId") in parents
                if child and job not in seen:  # a job whose workers left two runs: once
                    seen.add(job)
                    out.append(job)
            token = page.token
            if not token:
                return out

    def lineage(self, run_id: str) -> Lineage:
        raise NotImplementedError("lineage: not implemented by TorchX 0.7.0's backends either")


def create(config: str | None) -> MLflowTracker:
    """The factory: ``config`` is ``URI[#EXPERIMENT]``."""
    return MLflowTracker(*parse_config(config))
