"""The mlflow backend's sources against a sqlite tracking store in a tmp dir (no server):
workers adding sources at once lose none, and runs written by an older xrun (one list tag)
still read right."""

from __future__ import annotations

import json

import pytest

from xrun.tracker.base import TrackerSource
from xrun.tracker.mlflow_backend import SOURCE_TAG, SOURCES_TAG, MLflowTracker, create

# A fresh sqlite store (the mlflow_sqlite fixture) runs MLflow's migrations first: tens of
# seconds on a loaded machine.
pytestmark = pytest.mark.timeout(600)

JOB = "local_cwd://default/trial-1"
SWEEP = "local_cwd://default/sweep-1"


def test_two_workers_adding_sources_at_once_lose_neither(mlflow_sqlite: str) -> None:
    """Worker A reads the job's run, worker B adds its source meanwhile, then A writes: A's
    write must not drop B's source. (With every source in one list tag, A wrote back the list
    it had read, without B's source, and `sources()` said only A's.)"""
    job = "local_cwd://default/raced-sources"
    a, b = create(mlflow_sqlite), create(mlflow_sqlite)
    a.add_metadata(job, lr=0.1)  # the job's run exists: both workers write into it
    get_run = a.client.get_run
    reads = []

    def read_then_b_writes(rid: str) -> object:
        run = get_run(rid)
        reads.append(rid)
        if len(reads) == 1:  # between A's read and A's write
            b.add_source(job, "s3://data/b", "dataset")
        return run

    a.client.get_run = read_then_b_writes  # type: ignore[method-assign]
    a.add_source(job, "s3://data/a", "dataset")
    assert reads  # the interleaving happened

    assert {(s.source_run_id, s.artifact_name) for s in create(mlflow_sqlite).sources(job)} == {
        ("s3://data/a", "dataset"),
        ("s3://data/b", "dataset"),
    }


def test_sources_read_in_the_order_added_once_each(mlflow_sqlite: str) -> None:
    t = create(mlflow_sqlite)
    t.add_source(JOB, SWEEP)
    t.add_source(JOB, "s3://data/v1", "dataset")
    t.add_source(JOB, SWEEP)  # again: still once, in its first place
    again = create(mlflow_sqlite)
    assert again.sources(JOB) == [
        TrackerSource(SWEEP, None),
        TrackerSource("s3://data/v1", "dataset"),
    ]
    assert again.sources(JOB, "dataset") == [TrackerSource("s3://data/v1", "dataset")]
    assert again.run_ids(parent_run_id=SWEEP) == [JOB]  # the first source is the parent run


def test_a_run_with_the_old_list_tag_still_reads(mlflow_sqlite: str) -> None:
    """A run an older xrun wrote keeps its sources in the one tag ``xrun.sources``: read
    first, and a source added again is not added twice."""
    job = "local_cwd://default/old-run"
    t: MLflowTracker = create(mlflow_sqlite)
    t.add_metadata(job, lr=0.1)
    old = [[SWEEP, None], ["s3://data/v0", "dataset"]]
    t.client.set_tag(t._find(job) or "", SOURCES_TAG, json.dumps(old))
    t.add_source(job, "s3://data/v0", "dataset")  # already in the old tag
    t.add_source(job, "s3://data/v1", "dataset")
    assert create(mlflow_sqlite).sources(job) == [
        TrackerSource(SWEEP, None),
        TrackerSource("s3://data/v0", "dataset"),
        TrackerSource("s3://data/v1", "dataset"),
    ]


def test_a_source_tag_that_does_not_read_leaves_the_others_readable(mlflow_sqlite: str) -> None:
    """A source tag cut short (a store truncates a value over its limit) or written by hand:
    the run's other sources still read, and more can be added."""
    job = "local_cwd://default/damaged-tag"
    t: MLflowTracker = create(mlflow_sqlite)
    t.add_source(job, SWEEP)
    rid = t._find(job) or ""
    t.client.set_tag(rid, SOURCE_TAG + "cut", '["s3://data/very-long", "dat')
    t.client.set_tag(rid, SOURCE_TAG + "odd", '{"not": "a source"}')
    t.add_source(job, "s3://data/v1", "dataset")
    assert create(mlflow_sqlite).sources(job) == [
        TrackerSource(SWEEP, None),
        TrackerSource("s3://data/v1", "dataset"),
    ]
