"""``xrun stacks`` on docker, against the real Docker Engine: a 2x2 dist.ddp job (two
containers, two workers each) of a torch-free worker, one rank parked elsewhere."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import xrun
from tests.helpers.paths import SCRIPTS
from xrun.components.dist import ddp
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.request import container_name

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PARK = SCRIPTS / "park.py"


def line_of(text: str) -> int:
    return next(i for i, ln in enumerate(PARK.read_text().splitlines(), 1) if text in ln)


@pytest.fixture
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


def test_stacks_of_a_two_container_job(sched: DockerScheduler, tmp_path: Path) -> None:
    shutil.copy(PARK, tmp_path / PARK.name)
    app = ddp("2", script=PARK.name, j="2x2", name="park", image="xrun-python:latest")
    app_id = sched.submit(app, {}, str(tmp_path))
    handle = f"docker://default/{app_id}"
    try:
        deadline = time.monotonic() + 120
        doc: dict = {}
        while time.monotonic() < deadline:  # until both agents have their workers parked
            p = xrun("stacks", "--json", handle)
            if p.returncode == 0:
                doc = json.loads(p.stdout)
                ranks = doc["roles"].get("park", {})
                if len(ranks) == 4 and all(r.get("threads") for r in ranks.values()):
                    break
            time.sleep(0.5)
        assert sorted(doc["roles"]["park"]) == ["0", "1", "2", "3"], doc
        p = xrun("stacks", handle)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        stuck, wait = line_of("def stuck_here") + 2, line_of("def wait_for_peers") + 2
        assert lines[0] == (
            f"4 ranks, 2 group(s): rank 2 in stuck_here (park.py:{stuck}); "
            f"ranks 0,1,3 in wait_for_peers (park.py:{wait})"
        )
        hosts = [container_name(app_id, "park", i) for i in range(2)]
        assert lines[1] == f"rank 2 (1/4) on {hosts[1]}: stuck_here (park.py:{stuck})"
        assert f"ranks 0,1,3 (3/4) on {hosts[0]}, {hosts[1]}: wait_for_peers" in p.stdout
        # py-spy reads the workers through ptrace: the containers were given the capability
        caps = [c.attrs["HostConfig"]["CapAdd"] for c in sched._containers(app_id)]
        assert caps == [["CAP_SYS_PTRACE"]] * 2 or caps == [["SYS_PTRACE"]] * 2, caps
    finally:
        sched.cancel(app_id)


def test_stacks_never_stops_a_job_whose_agent_handles_sigusr1(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    """P3: the agent stops the job on every signal of PET_SIGNALS_TO_HANDLE; `xrun stacks`
    reads the stacks (asked inside the container) and the container runs on."""
    (tmp_path / "idle.py").write_text('import time\nprint("up", flush=True)\ntime.sleep(300)\n')
    env = {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGUSR1"}
    app = ddp(script="idle.py", j="1x1", name="idle", image="xrun-python:latest", env=env)
    app_id = sched.submit(app, {}, str(tmp_path))
    handle = f"docker://default/{app_id}"
    try:
        deadline = time.monotonic() + 120
        doc: dict = {}
        while time.monotonic() < deadline:  # until the worker runs its sleep
            p = xrun("stacks", "--json", handle)
            doc = json.loads(p.stdout) if p.stdout.strip() else {}
            r0 = doc.get("roles", {}).get("idle", {}).get("0", {})
            if p.returncode == 0 and r0.get("threads"):
                break
            assert [c.status for c in sched._containers(app_id)] == ["running"], p.stderr
            time.sleep(0.5)
        main = [t for t in r0["threads"] if t["main"]][0]
        assert main["frames"][-1]["name"] == "<module>", doc
        assert xrun("stacks", handle).returncode == 0
        time.sleep(1)
        assert [c.status for c in sched._containers(app_id)] == ["running"]
        status = xrun("status", handle).stdout
        assert "State: RUNNING" in status, status
    finally:
        sched.cancel(app_id)
