"""Issue #31 P14 on the real Docker Engine: the workspace image's build context is streamed, so
the CLI's memory does not grow with the workspace (it was one in-memory tar: a workspace of
200 MiB took the CLI to 447 MB RSS)."""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers.box import ULIMIT_V, boxed_peak_rss, tmpfs
from tests.helpers.docker import docker_engine  # noqa: F401
from tests.helpers.paths import XRUN


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_200_mib_workspace_builds_and_runs_in_bounded_memory(
    docker_engine: str, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "q.py").write_text("import os; print('big', os.path.getsize('big.bin'))\n")
    with open(ws / "big.bin", "wb") as f:
        f.truncate(200 << 20)  # sparse: costs no disk here (the image holds it, removed below)
    repo = f"xrun-test-p14-{uuid.uuid4().hex[:8]}"  # this test's images only, removed after
    argv = ["run", "-s", "docker", "--wait", "-cfg", f"image_repo={repo}"]
    argv += ["--workspace", str(ws), "dist.ddp", "-j", "1x1", "--script", "q.py"]
    argv += ["--image", docker_engine]
    try:
        with tmpfs(tmp_path / "box", size="16m", inodes=2000) as box:
            r, peak_kb = boxed_peak_rss([*ULIMIT_V, XRUN, *argv], box, timeout=300)
            assert r.returncode == 0, r.stderr[-3000:]
            assert "ended SUCCEEDED" in r.stderr, r.stderr[-3000:]
            logs = subprocess.run(
                [XRUN, "log", r.stdout.strip().splitlines()[0]],
                capture_output=True, text=True, timeout=60,
                env={**os.environ, "XDG_STATE_HOME": str(box / "state")},
            )  # fmt: skip
            assert f"big {200 << 20}" in logs.stdout, (logs.stdout, logs.stderr)
        assert peak_kb < 150_000, f"peak RSS {peak_kb} KiB for a 200 MiB workspace"
    finally:
        subprocess.run(
            f"docker images -q {repo} | sort -u | xargs -r docker rmi -f",
            shell=True, capture_output=True, timeout=120,
        )  # fmt: skip
