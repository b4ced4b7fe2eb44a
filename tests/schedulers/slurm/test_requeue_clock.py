"""The ``requeued`` marker (a job, or an array task, between two attempts of a requeue) read
without a cluster: its age on the file server's clock only, whatever the reader's clock says.

The file server is this machine's filesystem; a reader whose clock is off is this process with
``time.time`` moved; the marker's age is set with ``os.utime``, as a compute node writing it
that long ago would have.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from xrun.schedulers.slurm import scheduler, sweep


@pytest.fixture(params=["job", "array task"])
def requeueing(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The check a plain job's status makes, or a job array task's."""
    return scheduler._requeueing if request.param == "job" else sweep._requeueing


def skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This reader's clock ``seconds`` ahead of the file server's (behind: negative)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def marker(log_dir: Path, age_s: float) -> None:
    """The batch script's marker, written ``age_s`` ago on the server's clock."""
    path = log_dir / "requeued"
    path.write_text("0\n")
    written = os.stat(path).st_mtime - age_s
    os.utime(path, (written, written))


@pytest.mark.parametrize("ahead_s", [0, 30, 3600])
def test_a_fresh_marker_is_a_requeue_however_far_ahead_the_readers_clock(
    requeueing, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead_s: float
) -> None:  # type: ignore[no-untyped-def]
    marker(tmp_path, age_s=1)
    skew(monkeypatch, ahead_s)
    assert requeueing(str(tmp_path)) is True
    assert os.listdir(tmp_path) == ["requeued"]  # the reader's probe is gone again


@pytest.mark.parametrize("behind_s", [0, 120, 3600])
def test_a_stale_marker_is_no_requeue_however_far_behind_the_readers_clock(
    requeueing, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behind_s: float
) -> None:  # type: ignore[no-untyped-def]
    marker(tmp_path, age_s=60)
    skew(monkeypatch, -behind_s)
    assert requeueing(str(tmp_path)) is False


def test_no_marker_or_no_folder_is_no_requeue(requeueing, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert requeueing(str(tmp_path)) is False
    assert requeueing(str(tmp_path / "gone")) is False


def test_a_reader_that_cannot_write_there_falls_back_to_its_own_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another account's job, a read-only mount (an error this test, run as any user, cannot
    make with permissions: root writes anyway)."""
    from xrun.schedulers.slurm import requeue

    monkeypatch.setattr(requeue, "_server_now", lambda folder: None)
    marker(tmp_path, age_s=1)
    assert requeue.requeueing(str(tmp_path)) is True
    marker(tmp_path, age_s=60)
    assert requeue.requeueing(str(tmp_path)) is False
