"""A sweep on the real Docker Engine (tests/helpers/docker.py): three trials, each a normal
docker app (containers, network, watcher), the workspace image built once for all of them."""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.docker import docker_engine  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def test_three_trial_sweep(docker_engine: str, tmp_path: Path) -> None:
    env = Env(tmp_path)
    (env.cwd / "data.txt").write_text("from the workspace\n")
    r = env.run(
        "run", "-s", "docker", "--wait", "--sweep", "x=1,2,3", "--max-parallel", "2",
        "utils.sh", "--image", docker_engine, "--cpu", "1",
        "echo x={{x}} env=$XRUN_SWEEP_X trial=$XRUN_TRIAL_INDEX/$XRUN_SWEEP_SIZE $(cat data.txt);"
        " test {{x}} != 2",
        timeout=240,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # trial 1 (x=2) failed, the others ran to the end
    handle = r.stdout.strip()
    assert handle.startswith("docker://default/sh-sweep-"), r.stdout
    st = env.run("status", handle)
    rows = {
        int(c[0]): c for c in (ln.split() for ln in st.stdout.splitlines()) if c and c[0].isdigit()
    }
    assert [rows[i][2] for i in range(3)] == ["SUCCEEDED", "FAILED", "SUCCEEDED"], st.stdout
    assert [rows[i][3] for i in range(3)] == ["0", "1", "0"]
    images = set()
    for i in range(3):
        assert rows[i][4].startswith(rows[i][6]), rows[i]  # the host: the trial's container
        log = env.run("log", f"{handle}/{i}")
        assert log.stdout == f"sh/0 x={i + 1} env={i + 1} trial={i}/3 from the workspace\n", log
        desc = env.run("describe", f"docker://default/{rows[i][6]}")
        images |= {ln.split(":", 1)[1].strip() for ln in desc.stdout.splitlines() if "image:" in ln}
    assert len(images) == 1, images  # every trial ran the one workspace image
    # the sweep's handle and a trial's work like an app's: every trial's log, prefixed
    # TRIAL/role/replica; a trial's own status; the template and the trial table
    every = env.run("log", handle)
    assert sorted(every.stdout.splitlines()) == [
        f"{i}/sh/0 x={i + 1} env={i + 1} trial={i}/3 from the workspace" for i in range(3)
    ], every
    one = env.run("status", f"{handle}/1")
    assert one.stdout.startswith(f"Handle: {handle}/1\nState: FAILED\n"), one.stdout
    assert "exit_code=1" in one.stdout
    desc = env.run("describe", handle)
    assert "test {{x}} != 2" in desc.stdout and "# Trials: 3 trials:" in desc.stdout
    listed = env.run("list", "-s", "docker").stdout.splitlines()
    assert f"{handle}\tFAILED\tsh (sweep: SUCCEEDED=2,FAILED=1)" in listed, listed
    trial_apps = {rows[i][6] for i in range(3)}
    assert not [ln for ln in listed if any(a in ln for a in trial_apps)]  # in the sweep's line
