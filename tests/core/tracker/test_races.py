"""The fsspec tracker read while another process writes it (the store is shared by every rank
of a job and by `xrun tracker` in another shell): a reader must see an entry whole or not at
all. The writer is stopped exactly between creating a file and filling it, and read there."""

from __future__ import annotations

from pathlib import Path

import pytest

from xrun.tracker import fsspec_backend
from xrun.tracker.fsspec_backend import FsspecTracker, create

RUN, SOURCE = "local_cwd://default/child", "local_cwd://default/parent"


@pytest.mark.parametrize("written", ["", "data"])
def test_a_source_read_while_it_is_written_is_not_there_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    tracker = create(str(tmp_path))
    seen = []

    def write(self: object, path: str, text: str, append: bool = False) -> None:
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(text[: len(written)])
            f.flush()
            # Another process reads the store now: "dataset\n" is only partly on disk.
            seen.append(FsspecTracker(create(str(tmp_path))._store).sources(RUN))
            f.write(text[len(written) :])

    monkeypatch.setattr(fsspec_backend._Local, "write", write)
    tracker.add_source(RUN, SOURCE, "dataset")
    assert seen == [[]]
    sources = tracker.sources(RUN)
    assert [(s.source_run_id, s.artifact_name) for s in sources] == [(SOURCE, "dataset")]


def test_a_source_without_artifact_is_read_once_written(tmp_path: Path) -> None:
    tracker = create(str(tmp_path))
    tracker.add_source(RUN, SOURCE)
    assert [(s.source_run_id, s.artifact_name) for s in tracker.sources(RUN)] == [(SOURCE, None)]


def test_two_writers_at_the_same_time_ns_keep_both_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers of a job (two trackers on one root) whose clocks read the same time_ns:
    neither entry replaces the other. (Named by time_ns alone, the second write replaced the
    first: one file, and the first worker's metadata and artifact were gone.)"""
    monkeypatch.setattr(fsspec_backend.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    a, b = create(str(tmp_path)), create(str(tmp_path))
    a.add_metadata(RUN, rank0=1)
    b.add_metadata(RUN, rank1=1)
    a.add_artifact(RUN, "model0", "/ckpt/0")
    b.add_artifact(RUN, "model1", "/ckpt/1")
    reader = create(str(tmp_path))
    assert reader.metadata(RUN) == {"rank0": 1, "rank1": 1}
    assert sorted(reader.artifacts(RUN)) == ["model0", "model1"]
    run_dir = tmp_path / fsspec_backend.encode_run_id(RUN)
    assert len(list((run_dir / "metadata").iterdir())) == 2


def test_entries_read_in_time_order_old_names_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One writer's entries at one time_ns read in the order written; an entry named by
    time_ns alone (TorchX's, or an older xrun's) takes its place by its time."""
    clock = [200]
    monkeypatch.setattr(fsspec_backend.time, "time_ns", lambda: clock[0])
    t = create(str(tmp_path))
    t.add_metadata(RUN, lr=0.1, step=1)
    t.add_metadata(RUN, lr=0.2)  # the same time_ns: still after the first
    folder = tmp_path / fsspec_backend.encode_run_id(RUN) / "metadata"
    (folder / "100").write_text('{"metadata": {"lr": 0.0, "old": 1, "step": 0}}')  # earlier
    (folder / "300").write_text('{"metadata": {"step": 3}}')  # later
    assert create(str(tmp_path)).metadata(RUN) == {"lr": 0.2, "old": 1, "step": 3}
