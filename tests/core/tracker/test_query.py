"""The Python API of ``xrun tracker list``: xrun.tracker.query."""

from __future__ import annotations

from pathlib import Path

import pytest

from xrun.config import load
from xrun.errors import UsageError
from xrun.tracker import TrackerArtifact
from xrun.tracker.fsspec_backend import create
from xrun.tracker.query import list_artifacts, list_jobs, list_metadata


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("TORCHX_TRACKERS", "TORCHX_TRACKER_FSSPEC_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_the_default_store_read_without_creating_it(tmp_path: Path) -> None:
    config = load(cwd=tmp_path, home=tmp_path)
    assert list_jobs(config=config) == []
    assert not (tmp_path / "state").exists()  # a read creates nothing
    t = create(None)
    t.add_metadata("slurm://default/1", loss=0.5)
    t.add_artifact("slurm://default/1", "ckpt", "/c.pt")
    assert list_jobs(config=config) == ["slurm://default/1"]
    assert list_metadata("slurm://default/1", config) == {"loss": 0.5}
    assert list_artifacts("slurm://default/1", config=config) == [
        TrackerArtifact("ckpt", "/c.pt", None)
    ]
    assert list_artifacts("slurm://default/1", "other", config) == []


def test_the_first_configured_tracker(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (tmp_path / ".xrunconfig").write_text(
        f"[torchx:tracker]\nfsspec =\n[tracker:fsspec]\nconfig = {root}\n"
    )
    create(str(root)).add_source("local_cwd://default/c", "local_cwd://default/p")
    config = load(cwd=tmp_path, home=tmp_path / "nohome")
    assert list_jobs(config=config) == ["local_cwd://default/c"]
    assert list_jobs("local_cwd://default/p", config) == ["local_cwd://default/c"]
    assert list_jobs("local_cwd://default/x", config) == []


def test_turned_off(tmp_path: Path) -> None:
    (tmp_path / ".xrunconfig").write_text("[torchx:tracker]\n")
    with pytest.raises(UsageError, match="tracking is turned off"):
        list_jobs(config=load(cwd=tmp_path, home=tmp_path / "nohome"))
