"""``dist.ddp --spares 1`` on the real Docker Engine: 2 replicas x 1 gloo worker + 1 spare, one
container per replica. ``docker kill`` of an active replica's container (not replica 0: its
agent serves the rendezvous store, docs/runtime.md) loses that node; the spare's agent takes its
node rank and RANK, training goes on, and the app ends SUCCEEDED: the role may lose its spare's
worth of replicas (``min_replicas`` = 2 of 3), so the container that died with 137 is a FAILED
replica of an app that succeeded, not a failed app. torch comes from the suite's venv,
bind-mounted (the base image has none)."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.spares import events
from tests.helpers.waiting import wait_for
from xrun.components.dist import ddp
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.request import container_name
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SITE = sysconfig.get_paths()["purelib"]  # torch, for the containers' python3 (3.11 both)
CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=120"


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


def test_spare_takes_the_rank_of_a_killed_container(sched: DockerScheduler, tmp_path: Path) -> None:
    if not Path(SITE, "torch").is_dir():
        pytest.skip(f"no torch in {SITE}")
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    shutil.copy(SCRIPTS / "spare_worker.py", ws / "spare_worker.py")
    app = ddp(
        "/out", script="spare_worker.py", j="2x1", spares=1, image="xrun-python:latest",
        env={"PYTHONPATH": "/opt/xrun:/venv-site"}, rdzv_conf=CONF, max_retries=3,
        mounts=[f"type=bind,src={out},dst=/out", f"type=bind,src={SITE},dst=/venv-site,readonly"],
    )  # fmt: skip
    role = app.roles[0].name
    app_id = sched.submit(app, {}, str(ws))
    names = [container_name(app_id, role, k) for k in range(3)]

    def stderr() -> str:
        return "".join("".join(sched.log_iter(app_id, role, k)) for k in range(3))

    try:
        wait_for(lambda: len(events(out)) >= 2, timeout=300, what="the first world")
        first = {e["host"]: e["RANK"] for e in events(out)}
        spare = next(n for n in names if n not in first)
        lost = next(n for n in names[1:] if n in first)
        t0 = time.monotonic()
        subprocess.run(["docker", "kill", lost], check=True, capture_output=True, timeout=60)
        wait_for(lambda: len(events(out)) >= 4, timeout=240, what="the world with the spare")
        took = time.monotonic() - t0
        second = {e["host"]: e["RANK"] for e in events(out)[2:4]}
        assert second[spare] == first[lost], (first, second)
        assert set(second.values()) == {"0", "1"}
        # the app goes on with a dead container: it is not FAILED meanwhile
        resp = sched.describe(app_id)
        assert resp is not None and resp.state == AppState.RUNNING, resp
        (out / "go").touch()
        deadline = time.monotonic() + 240
        while (resp := sched.describe(app_id)) is not None and resp.state == AppState.RUNNING:
            assert time.monotonic() < deadline, resp
            time.sleep(0.5)
    finally:
        sched.cancel(app_id)
    assert resp is not None
    assert resp.state == AppState.SUCCEEDED, (resp.msg, stderr()[-4000:])
    k = names.index(lost)
    assert "exited with code 137" in resp.msg and "a spare took the place" in resp.msg, resp.msg
    # and so it stays once the containers are gone (the record in the state dir), from any shell
    wait_for(lambda: not subprocess.run(["docker", "ps", "-aq", "-f", f"name={lost}"],
             capture_output=True, text=True, timeout=60).stdout.strip(),
             timeout=120, what="the containers removed")  # fmt: skip
    status = subprocess.run(
        [XRUN, "status", f"docker://default/{app_id}"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "State: SUCCEEDED" in status and f"{role}/{k}: FAILED" in status, status
    spare_line = f"  {role}/{names.index(spare)} took group rank {first[lost]} in round 1"
    assert spare_line in status and f"  lost: {role}/{k}" in status, status
    replica = resp.roles_statuses[0].replicas[k]
    assert replica.state == AppState.FAILED and replica.exit_code == 137, replica
    print(f"docker --spares: killed {lost}; the spare {spare} took RANK {first[lost]}, "
          f"next world {took:.1f} s after the kill")  # fmt: skip
