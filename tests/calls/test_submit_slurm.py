"""``xrun.submit`` on the real Slurm cluster (four nodes on this host): one sbatch, srun, the
runtime agent on each node, the call on every rank; the outcome comes back through the call's
folder (a shared filesystem on a real cluster; here the nodes share this host's)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

import xrun
from tests.helpers import slurm as slurm_fixture
from tests.helpers.slurm import SlurmCluster
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

slurm_cluster = slurm_fixture.slurm_cluster


def on_node(x: int) -> tuple[int, int, int, str]:
    if x < 0:
        raise KeyError(f"negative {x}")
    print(f"rank {os.environ['RANK']} on {os.environ['SLURMD_NODENAME']}", flush=True)
    return (
        x * 2,
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        os.environ["SLURMD_NODENAME"],
    )


def test_a_call_runs_on_two_slurm_nodes_and_an_error_comes_back(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # slurm-logs/ goes here
    job = xrun.submit(on_node, 21, scheduler="slurm", j="2x2", all_ranks=True)
    assert job.handle.startswith("slurm://") and job.job_id.isdigit()
    out = job.result(timeout=240)
    assert [o[1] for o in out] == [0, 1, 2, 3] and {o[2] for o in out} == {4}
    assert {o[0] for o in out} == {42}
    nodes = [o[3] for o in out]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]  # two nodes, two ranks each
    assert set(nodes) <= set(slurm_cluster.nodes)
    # result() came with the outcome files; the logs are whole once the job has ended.
    assert job.wait(timeout=240).state == AppState.SUCCEEDED
    assert f"rank 3 on {nodes[3]}\n" in job.stdout(3)
    bad = xrun.submit(on_node, -1, scheduler="slurm")
    with pytest.raises(KeyError, match="negative -1") as info:
        bad.result(timeout=240)
    assert "in on_node" in info.value.remote_traceback  # type: ignore[attr-defined]
    assert bad.wait(timeout=240).state == AppState.FAILED


def test_map_array_is_one_slurm_job_array(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    jobs = xrun.map_array(on_node, [1, 2, 3, 4, 5], scheduler="slurm")
    array_ids = {j.job_id.split("/")[0] for j in jobs}
    assert len(array_ids) == 1 and next(iter(array_ids)).isdigit()  # ONE sbatch
    assert [j.job_id.split("/")[1] for j in jobs] == ["0", "1", "2", "3", "4"]
    assert [j.result(timeout=240)[0] for j in jobs] == [2, 4, 6, 8, 10]
    # Slurm itself knows them as one array's tasks.
    array_id = next(iter(array_ids))
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", array_id], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    tasks = re.findall(rf"ArrayJobId={array_id} ArrayTaskId=(\d+)", out.stdout)
    assert sorted(tasks, key=int) == ["0", "1", "2", "3", "4"]


class Resumable:
    """submitit's Checkpointable: ``checkpoint`` says what the requeued job calls."""

    def __init__(self) -> None:
        self.checkpoints = 0

    def __call__(self, folder: str) -> tuple[int, str]:
        started = Path(folder, "started")
        if self.checkpoints == 0:
            if started.exists():
                raise RuntimeError("requeued without the checkpoint")
            started.write_text(os.environ["SLURMD_NODENAME"])
            time.sleep(600)  # preempted meanwhile
        return self.checkpoints, os.environ["SLURM_JOB_ID"]

    def checkpoint(self, folder: str) -> tuple[Resumable, tuple[str], dict[str, object]]:
        self.checkpoints += 1
        return self, (folder,), {}


def test_a_preempted_call_is_checkpointed_requeued_and_resumed(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = {"partition": "low", "exclusive": True, "job_name": "preempt-call"}
    job = xrun.submit(Resumable(), str(tmp_path), scheduler="slurm", cfg=cfg, max_retries=1)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.2)
        node = (tmp_path / "started").read_text()
        # A job on `high` that needs the call's node: Slurm preempts the call for it.
        subprocess.run(
            ["sbatch", "--parsable", "-p", "high", "-N1", f"--nodelist={node}", "-J",
             "preemptor-call", "-o", "/dev/null", "--wrap", "sleep 1"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        deadline = time.monotonic() + 200
        held_since: float | None = None
        while not job.done():
            # Slurm holds a requeued job ~120 s (BeginTime); cut that short, as
            # tests/schedulers/slurm/test_preemption.py does.
            show = subprocess.run(
                ["scontrol", "show", "job", job.job_id], capture_output=True, text=True
            ).stdout
            if "Reason=BeginTime" in show:
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since > 3:
                    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"])
            assert time.monotonic() < deadline, f"stuck: {show}"
            time.sleep(0.3)
        checkpoints, slurm_id = job.result(timeout=10)
        assert checkpoints == 1 and slurm_id == job.job_id  # the same job, requeued
        assert job.wait().state == AppState.SUCCEEDED
    finally:
        subprocess.run(["scancel", "--name=preempt-call,preemptor-call"], check=False)
