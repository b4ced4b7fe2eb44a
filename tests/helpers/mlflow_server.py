"""A real ``mlflow server`` for the mlflow tracker's tests: on 127.0.0.1, a sqlite backend
store and a local artifact root in a temporary dir, started once per test module."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import poll_until

MLFLOW = str(Path(sys.executable).with_name("mlflow"))
START_TIMEOUT_S = 300  # a fresh sqlite store's migrations + imports: 25 s on a loaded 2-core
# machine, over 120 s at load 15 (a stress run beside benchmarks)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def running_server(d: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A server with its store in ``d``: its URL and its process (the leader of its own
    session: a test that kills the server kills that group)."""
    port = free_port()
    log = open(d / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            MLFLOW, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{d}/mlflow.db",
            "--artifacts-destination", str(d / "artifacts"),
        ],
        cwd=d, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        up = poll_until(lambda: _healthy(url) or proc.poll() is not None, START_TIMEOUT_S, 0.5)
        if not (up and _healthy(url)):
            raise AssertionError(f"mlflow server did not start: {(d / 'server.log').read_text()}")
        yield url, proc
    finally:
        # its own session: the uvicorn workers it started go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's URL."""
    with running_server(tmp_path_factory.mktemp("mlflow")) as (url, _):
        yield url
