"""The mlflow backend within MLflow's limits (a tag value: 8000 characters, a key: 250),
against a sqlite tracking store in a tmp dir (no server). A store cuts a longer value short
(``MLFLOW_TRUNCATE_LONG_VALUES``, the default) or refuses it, and refuses a longer key: the
backend writes nothing that would not read back whole, and never raises for it (a raise drops
the backend for the rest of the process)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from xrun.tracker.base import TrackerArtifact, TrackerSource
from xrun.tracker.mlflow_backend import (
    ARTIFACT_TAG,
    JOB_TAG,
    MAX_KEY,
    MAX_TAG_VALUE,
    SOURCE_TAG,
    MLflowTracker,
    create,
)

# A fresh sqlite store (the mlflow_sqlite fixture) runs MLflow's migrations first: tens of
# seconds on a loaded machine.
pytestmark = pytest.mark.timeout(600)

SWEEP = "local_cwd://default/sweep-1"
TRUNCATE = pytest.mark.parametrize("truncate", ["true", "false"], ids=["cut", "refused"])


def _tags(t: MLflowTracker, job: str, prefix: str) -> dict[str, str]:
    run = t.client.get_run(t._find(job) or "")
    return {k: v for k, v in run.data.tags.items() if k.startswith(prefix)}


def test_the_limits_are_mlflows() -> None:
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_TAG_VAL_LENGTH

    assert (MAX_TAG_VALUE, MAX_KEY) == (MAX_TAG_VAL_LENGTH, MAX_ENTITY_KEY_LENGTH)


@TRUNCATE
def test_a_source_over_the_value_limit_is_left_out_with_one_line(
    mlflow_sqlite: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    truncate: str,
) -> None:  # fmt: skip
    """Its tag (and the job tag of its parent run) would be cut short, or refused, which
    raised: it is left out, said once on stderr, and the run's other sources still read."""
    monkeypatch.setenv("MLFLOW_TRUNCATE_LONG_VALUES", truncate)
    job = f"local_cwd://default/long-source-{truncate}"
    long = "s3://data/" + "x" * MAX_TAG_VALUE
    t = create(mlflow_sqlite)
    t.add_source(job, SWEEP)
    capsys.readouterr()
    t.add_source(job, long, "dataset")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("xrun.tracker: ") and f"{MAX_TAG_VALUE}" in line, line
    assert create(mlflow_sqlite).sources(job) == [TrackerSource(SWEEP, None)]
    assert len(_tags(t, job, SOURCE_TAG)) == 1  # nothing cut short stored
    cut = t.client.search_runs(
        [t.experiment_id], filter_string=f"tags.`{JOB_TAG}` LIKE 's3://data/x%'"
    )
    assert not cut  # no parent run created under a job tag cut short


@TRUNCATE
def test_an_artifacts_metadata_over_the_value_limit_is_left_out_with_one_line(
    mlflow_sqlite: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    truncate: str,
) -> None:  # fmt: skip
    """Its tag would be cut short (then it did not read: artifacts() raised), or refused
    (raised): the artifact is kept without its metadata, said once on stderr."""
    monkeypatch.setenv("MLFLOW_TRUNCATE_LONG_VALUES", truncate)
    job = f"local_cwd://default/long-metadata-{truncate}"
    t = create(mlflow_sqlite)
    capsys.readouterr()
    t.add_artifact(job, "model", "/nowhere/model.pt", {"notes": "x" * MAX_TAG_VALUE})
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("xrun.tracker: ") and f"{MAX_TAG_VALUE}" in line, line
    assert create(mlflow_sqlite).artifacts(job) == {
        "model": TrackerArtifact("model", "/nowhere/model.pt", None)
    }


def test_an_artifact_tag_that_does_not_read_leaves_the_others_readable(mlflow_sqlite: str) -> None:
    """An artifact tag cut short (a store's value limit, an older xrun's write) or set by
    hand: the run's other artifacts still read (it raised JSONDecodeError, or KeyError, for
    every artifacts() of the run)."""
    job = "local_cwd://default/damaged-artifact"
    t = create(mlflow_sqlite)
    t.add_artifact(job, "model", "/nowhere/model.pt", {"step": 3})
    rid = t._find(job) or ""
    t.client.set_tag(rid, ARTIFACT_TAG + "cut", '{"name": "ckpt", "path": "/nowhere/ck')
    t.client.set_tag(rid, ARTIFACT_TAG + "list", '["not", "an artifact"]')
    t.client.set_tag(rid, ARTIFACT_TAG + "nameless", '{"path": "/nowhere/x"}')
    t.client.set_tag(rid, ARTIFACT_TAG + "odd-meta", '{"name": "x", "path": "/x", "metadata": 3}')
    t.client.set_tag(rid, ARTIFACT_TAG + "text", "plain text")
    t.add_artifact(job, "log", "/nowhere/log.txt")
    assert create(mlflow_sqlite).artifacts(job) == {
        "log": TrackerArtifact("log", "/nowhere/log.txt", None),
        "model": TrackerArtifact("model", "/nowhere/model.pt", {"step": 3}),
    }


def test_long_artifact_names_keep_keys_within_the_limit_and_apart(mlflow_sqlite: str) -> None:
    """Two names of 300 characters sharing their first 298: each its own tag, its key within
    MLflow's 250 (``xrun.artifact.`` + the name cut to 250 was refused: the backend dropped)."""
    job = "local_cwd://default/long-names"
    a, b = "x" * 298 + "-a", "x" * 298 + "-b"
    t = create(mlflow_sqlite)
    t.add_artifact(job, a, "/nowhere/a")
    t.add_artifact(job, b, "/nowhere/b")
    t.add_artifact(job, a, "/nowhere/a2")  # again: the same tag, rewritten
    keys = _tags(t, job, ARTIFACT_TAG)
    assert len(keys) == 2 and all(len(k) <= MAX_KEY for k in keys), keys
    assert create(mlflow_sqlite).artifacts(job) == {
        a: TrackerArtifact(a, "/nowhere/a2", None),
        b: TrackerArtifact(b, "/nowhere/b", None),
    }


def test_artifact_tags_written_the_old_way_still_read(mlflow_sqlite: str) -> None:
    """A short name's key is what it was. A long one's old key (``xrun.artifact.`` + the name
    cut to 250: 264 characters), in a store that took it (sqlite does not enforce the column's
    250), still reads; once the artifact is added again under the key of now, that one wins."""
    job = "local_cwd://default/old-keys"
    long = "y" * 300
    t = create(mlflow_sqlite)
    t.add_artifact(job, "model", "/nowhere/model.pt")
    rid = t._find(job) or ""
    assert list(_tags(t, job, ARTIFACT_TAG)) == [ARTIFACT_TAG + "model"]
    old_key = ARTIFACT_TAG + long[:250]
    entry = json.dumps({"name": long, "path": "/nowhere/old", "metadata": None})
    db = mlflow_sqlite.removeprefix("sqlite:///").partition("#")[0]
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", (old_key, entry, rid)
        )
    assert create(mlflow_sqlite).artifacts(job)[long] == TrackerArtifact(long, "/nowhere/old", None)
    t.add_artifact(job, long, "/nowhere/new")
    assert create(mlflow_sqlite).artifacts(job) == {
        "model": TrackerArtifact("model", "/nowhere/model.pt", None),
        long: TrackerArtifact(long, "/nowhere/new", None),
    }
