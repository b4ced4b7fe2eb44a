"""Fixtures shared by the local_cwd scheduler's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from xrun.schedulers.local_cwd import LocalCwdScheduler, create_scheduler


@pytest.fixture
def sched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCwdScheduler]:
    """A local_cwd scheduler of session "test", run from ``tmp_path``; closed afterwards."""
    monkeypatch.chdir(tmp_path)
    s = create_scheduler("test")
    yield s
    s.close()
