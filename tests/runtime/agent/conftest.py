"""Fixtures of the agent tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Agents started with Popen; whatever is still running at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)
