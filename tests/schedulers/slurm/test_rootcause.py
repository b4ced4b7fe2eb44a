"""slurm status names a failed rank's root cause (issue #24, item 4): sacct knows only an exit
code, so the status reads the replica's runtime agent's last stderr line.

OOM: this test cluster has no cgroup plugin (``TaskPlugin=task/none``,
``ProctrackType=proctrack/linuxproc``), so Slurm itself enforces no memory limit and records no
OUT_OF_MEMORY. What a cluster with ``task/cgroup`` does, putting the task in a limited memory
cgroup, the test does by hand (the replica enters a 256 MiB cgroup before it execs the agent),
through the real sbatch and srun; the kill is then the kernel's own OOM killer's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.cgroup import memory_cgroup
from tests.helpers.net import free_port
from tests.helpers.paths import REPO
from tests.helpers.slurm import SlurmCluster
from xrun.components.dist import ddp
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]
slurm_cluster = slurm_fixture.slurm_cluster
XRUN = str(Path(sys.executable).parent / "xrun")


@pytest.fixture
def sched(slurm_cluster: SlurmCluster) -> Iterator[SlurmScheduler]:
    s = create_scheduler("test")
    yield s
    s.close()


def _run(sched: SlurmScheduler, tmp_path: Path, fault: str, cgroup: Path | None) -> str:
    """Submit a 1x2 dist.ddp job whose rank 1 commits ``fault``; `xrun status` once it failed."""
    shutil.copy(REPO / "benchmarks" / "workers" / "faults.py", tmp_path / "faults.py")
    app = ddp(fault, "1", script="faults.py", j="1x2", cpu=1, rdzv_port=free_port(), name=fault)
    if cgroup is not None:
        role = app.roles[0]
        # "$$$$": role args go through the macro substitution, where "$$" is a literal "$"
        enter = f'echo $$$$ > {cgroup / "cgroup.procs"} && exec "$0" "$@"'
        role.args = ["-c", enter, role.entrypoint, *role.args]
        role.entrypoint = "sh"
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    try:
        resp = sched.wait(app_id, timeout=120)
    finally:
        subprocess.run(["scancel", app_id], check=False)
    assert resp is not None and resp.state == AppState.FAILED, resp
    out = subprocess.run(
        [XRUN, "status", f"slurm://default/{app_id}"], capture_output=True, text=True, timeout=60
    )
    return out.stdout


def test_status_names_the_traceback_without_record(sched: SlurmScheduler, tmp_path: Path) -> None:
    out = _run(sched, tmp_path, "raise", None)
    cause = "ValueError: bad shape in batch 7 (rank 1, faults.py:22)"
    assert f"error: {cause}" in out and f"Error: {cause}" in out, out


def test_status_names_the_oom_killer(sched: SlurmScheduler, tmp_path: Path) -> None:
    with memory_cgroup() as cg:
        out = _run(sched, tmp_path, "oom", cg)
    cause = "killed by the OOM killer: out of memory (SIGKILL; memory cgroup "
    assert f"error: {cause}" in out and f"Error: {cause}" in out, out
    assert f"{cg.name}: oom_kill 0 -> 1) (rank 1)" in out, out
