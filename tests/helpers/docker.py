"""The real Docker Engine the test suite starts: ``docker_engine`` yields the python3 base image.

Imported by tests/conftest.py (``from tests.helpers.docker import docker_engine``). The first
use installs docker.io/mmdebstrap if missing, starts dockerd and
builds the image (scripts/docker-engine.sh; ~35 s on a fresh machine, ~1 s after). Each pytest
process (xdist worker) holds a lease on the engine; the last one to finish stops the engine if
the script started it, and an engine someone else started is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.helpers.paths import REPO

ENGINE_SCRIPT = REPO / "scripts" / "docker-engine.sh"


def _engine(action: str) -> str:
    proc = subprocess.run(
        ["bash", str(ENGINE_SCRIPT), action, "--lease", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/docker-engine.sh {action} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    sys.stderr.write(proc.stderr)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str]:
    """The name of the local python3 base image (``xrun-python:latest``), engine running."""
    image = _engine("image")
    try:
        yield image
    finally:
        _engine("down")


@pytest.fixture
def no_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apps submitted in this test get no detached watcher (``schedulers/docker/watch.py``).

    The watcher is a finaliser and a gang stopper that polls every second at most: a test that
    waits for containers to be "exited" while nobody asks, or forces one reader against one
    finaliser, races it (it may remove the containers first, or stop a replica the test expects
    to end by itself). Such tests take this fixture; the watcher itself is tested with nobody
    watching in ``test_integration.py``.
    """
    from xrun.schedulers.docker import scheduler

    monkeypatch.setattr(scheduler, "start_watcher", lambda app_id, session: None)
