"""``xrun.submit`` on the docker scheduler, for real: the call runs in containers of the
python3-only base image (no pip, no cloudpickle of its own), the outcome comes back through
the call's folder, bind-mounted at the same path."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

import xrun
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


def inside(x: int) -> dict[str, object]:
    import cloudpickle

    return {
        "x2": x * 2,
        "rank": int(os.environ["RANK"]),
        "world": int(os.environ["WORLD_SIZE"]),
        "host": socket.gethostname(),
        "in_container": os.path.exists("/.dockerenv"),
        "cloudpickle": cloudpickle.__file__,
        "python": sys.version_info[:2],
    }


def test_a_call_runs_in_two_containers_and_returns(
    docker_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = xrun.submit(inside, 21, scheduler="docker", j="2x1", all_ranks=True)
    assert job.handle.startswith("docker://")
    out = job.result(timeout=500)
    assert [o["rank"] for o in out] == [0, 1] and {o["world"] for o in out} == {2}
    assert {o["x2"] for o in out} == {42}
    assert all(o["in_container"] for o in out)
    assert len({o["host"] for o in out}) == 2 and socket.gethostname() not in {
        o["host"] for o in out
    }
    # The base image has no cloudpickle: the worker used the copy xrun carried into it.
    assert all(str(o["cloudpickle"]).startswith("/opt/xrun/xrun/_deps/") for o in out)
    assert job.wait(timeout=240).state == AppState.SUCCEEDED
