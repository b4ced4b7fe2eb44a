"""``xrun stacks`` on Slurm: one task per node of the job, started inside its allocation
(``srun --jobid J --overlap``), asks the job's agents on that node
(``schedulers.stacks.ask_here``: only the job's own agents on the task's node, through their
request FIFOs; no signal, so a job submitted with ``-cfg signal=USR1@90`` runs on) and writes
their answers into the job's log dir; every node collects its own ranks, all at once. The host
a rank is shown on is its Slurm node name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from xrun.errors import SchedulerError

from ..stacks import NodeStacks
from .commands import run

# srun's own start-up on top of the agents' answer time.
_SRUN_SLACK_S = 30.0


def gather_stacks(job_id: str, log_dir: str, timeout: float) -> list[NodeStacks]:
    """Every node's answers; ``log_dir`` is the job's (on the file system the CLI shares with
    the nodes, as ``xrun log`` needs): each task's answer is written to a file there, because
    srun interleaves long lines of concurrent tasks on its own stdout."""
    proc = run(["squeue", "-h", "-j", job_id, "-o", "%D"])
    counts = [int(x) for x in proc.stdout.split() if x.isdigit()]
    if proc.returncode != 0 or not counts:
        raise SchedulerError(f"slurm job {job_id}: could not read its node count from squeue")
    n = sum(counts)
    code = (
        "from xrun.schedulers.stacks import ask_here; "
        f"ask_here({timeout!r}, ('SLURM_JOB_ID', 'SLURMD_NODENAME'))"
    )
    out_dir = tempfile.mkdtemp(prefix=".stacks-", dir=log_dir)
    argv = [
        "srun",
        f"--jobid={job_id}",
        "--overlap",  # beside the job's own steps, on their CPUs
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        "--quiet",
        f"--output={out_dir}/%t.json",
        sys.executable,  # the CLI's interpreter: xrun is installed there (a shared file system)
        "-c",
        code,
    ]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout + _SRUN_SLACK_S, check=False
        )
        nodes = _read_answers(out_dir)
    except subprocess.TimeoutExpired:
        raise SchedulerError(
            f"slurm job {job_id}: `srun --jobid={job_id} --overlap` did not finish in "
            f"{timeout + _SRUN_SLACK_S:g} s"
        ) from None
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if not nodes:
        last = (out.stderr.strip().splitlines() or ["nothing"])[-1]
        raise SchedulerError(
            f"slurm job {job_id}: no node answered (srun exited {out.returncode} and said: "
            f"{last[:300]})"
        )
    return sorted(nodes, key=lambda n: n.replica)


def _read_answers(out_dir: str) -> list[NodeStacks]:
    nodes: list[NodeStacks] = []
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            for line in f:
                try:
                    answers = json.loads(line)
                except ValueError:
                    continue  # not ours (a job's profile printing something)
                for a in answers:
                    nodes.append(
                        NodeStacks(str(a.get("replica")), a.get("doc"), a.get("note") or "")
                    )
    return nodes
