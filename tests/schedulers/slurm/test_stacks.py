"""``xrun stacks`` on the real Slurm cluster: a 2x2 dist.ddp job of a real gloo script on two
nodes, one rank hung; each node's agents are asked by a task inside the job."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import xrun
from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

HANG = SCRIPTS / "hang.py"


def line_of(text: str) -> int:
    return next(i for i, ln in enumerate(HANG.read_text().splitlines(), 1) if text in ln)


def _where(doc: dict, rank: int) -> str:
    r = doc["roles"].get("hang", {}).get(str(rank), {})
    main = [t for t in r.get("threads", ()) if t["main"]]
    return main[0]["frames"][0]["name"] if main else ""


def test_stacks_of_a_two_node_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    shutil.copy(HANG, tmp_path / HANG.name)
    run = subprocess.run(
        [XRUN, "run", "-s", "slurm", "dist.ddp", "-j", "2x2", "--cpu", "1", "--memMB", "512"]
        + ["--rdzv_port", str(free_port()), "--script", HANG.name]
        + ["--", "1000", "--hang-rank", "3", "--hang-step", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    handle = run.stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 180
        doc: dict = {}
        want = ["all_reduce"] * 3 + ["stuck_here"]
        while time.monotonic() < deadline:  # until rank 3 hangs and the others wait for it
            p = xrun("stacks", "--json", handle)
            if p.returncode == 0:
                doc = json.loads(p.stdout)
                if [_where(doc, r) for r in range(4)] == want:
                    break
            time.sleep(1)
        assert [_where(doc, r) for r in range(4)] == want, (doc, p.stderr)
        p = xrun("stacks", handle)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        stuck, reduce = line_of("time.sleep(3600)"), line_of("dist.all_reduce(t)")
        assert lines[0] == (
            f"4 ranks, 2 group(s): rank 3 in stuck_here (hang.py:{stuck}); "
            f"ranks 0-2 in all_reduce (hang.py:{reduce})"
        )
        # two nodes answered, each for its own ranks
        hosts = {doc["roles"]["hang"][str(r)]["host"] for r in range(4)}
        assert len(hosts) == 2, hosts
    finally:
        xrun("cancel", handle)


IDLE = 'import time\nprint("up", flush=True)\ntime.sleep(300)\n'


def test_stacks_never_stops_a_job_with_a_usr1_notice(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """P3: `-cfg signal=USR1@90` makes the agent stop the job on SIGUSR1 (its pre-emption
    notice, PET_SIGNALS_TO_HANDLE); `xrun stacks` reads the stacks and the job runs on."""
    (tmp_path / "idle.py").write_text(IDLE)
    run = subprocess.run(
        [XRUN, "run", "-s", "slurm", "-cfg", "signal=USR1@90", "dist.ddp", "-j", "1x1"]
        + ["--cpu", "1", "--memMB", "512", "--rdzv_port", str(free_port())]
        + ["--script", "idle.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    handle = run.stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 180
        doc: dict = {}
        while time.monotonic() < deadline:  # until the worker runs its sleep
            p = xrun("stacks", "--json", handle, timeout=120)
            doc = json.loads(p.stdout) if p.stdout.strip() else {}
            r0 = doc.get("roles", {}).get("idle", {}).get("0", {})
            if p.returncode == 0 and r0.get("threads"):
                break
            assert "FAILED" not in xrun("status", handle).stdout, p.stderr
            time.sleep(1)
        main = [t for t in r0["threads"] if t["main"]][0]
        assert main["frames"][-1]["name"] == "<module>", doc
        assert xrun("stacks", handle, timeout=120).returncode == 0
        time.sleep(2)
        status = xrun("status", handle).stdout
        assert "State: RUNNING" in status and "exit_code" not in status, status
    finally:
        xrun("cancel", handle)
