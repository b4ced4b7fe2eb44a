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
