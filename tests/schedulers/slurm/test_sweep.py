"""Sweeps on the real Slurm 22.05 cluster: one job array, through the real ``xrun`` CLI.

Each sweep runs in the test's tmp dir (its ``slurm-logs`` stay there; the nodes share this
host's filesystem, so the trials' marker files land there too). ``sbatch`` and ``squeue`` are
counted by wrappers first on PATH that log each call and run the real command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.cli import xrun
from tests.helpers.slurm import SlurmCluster
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]
slurm_cluster = slurm_fixture.slurm_cluster


class Shell:
    """A user's shell in ``work``: xrun with counting sbatch/squeue/scancel wrappers on PATH."""

    def __init__(self, tmp: Path) -> None:
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.calls = tmp / "calls.log"
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for cmd in ("sbatch", "squeue", "scancel"):
            real = shutil.which(cmd)
            assert real, cmd
            path = bin_dir / cmd
            path.write_text(f'#!/bin/sh\necho "{cmd} $*" >>{self.calls}\nexec {real} "$@"\n')
            path.chmod(0o755)
        self.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NO_COLOR": "1"}
        self.jobs: list[str] = []

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        r = xrun(*args, cwd=self.cwd, env=self.env, timeout=timeout)
        if args[0] == "run":
            self.jobs += re.findall(r"^slurm://\w+/(\d+)$", r.stdout, flags=re.M)
        return r

    def counted(self, cmd: str, having: str = "") -> int:
        """How many times ``cmd`` ran (with ``having`` among its arguments)."""
        text = self.calls.read_text() if self.calls.exists() else ""
        return sum(1 for ln in text.splitlines() if ln.split(" ", 1)[0] == cmd and having in ln)

    def forget_calls(self) -> None:
        self.calls.unlink(missing_ok=True)


@pytest.fixture
def shell(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Shell]:
    sh = Shell(tmp_path)
    yield sh
    if sh.jobs:  # nothing of this test may keep the shared cluster busy
        subprocess.run(["scancel", *sh.jobs], check=False, capture_output=True)


def rows(status_text: str) -> dict[int, list[str]]:
    """``xrun status`` of a sweep -> trial index -> its row's cells."""
    out = {}
    for line in status_text.splitlines():
        cells = line.split()
        if cells and cells[0].isdigit():
            out[int(cells[0])] = cells
    return out


def states(sh: Shell, handle: str) -> dict[int, str]:
    r = sh.run("status", handle)
    assert r.returncode == 0, r.stderr
    return {i: cells[2] for i, cells in rows(r.stdout).items()}


def max_overlap(work: Path, n: int) -> int:
    """Most trials running at once, from the start/end times each trial wrote."""
    events = []
    for i in range(n):
        events.append((float((work / f"start.{i}").read_text()), 1))
        events.append((float((work / f"end.{i}").read_text()), -1))
    running = most = 0
    for _, step in sorted(events):
        running += step
        most = max(most, running)
    return most


TRIAL = (
    "date +%s.%N > start.{{x}}; echo trial {{x}} $XRUN_TRIAL_INDEX/$XRUN_SWEEP_SIZE "
    "x=$XRUN_SWEEP_X; sleep 2; date +%s.%N > end.{{x}}; test {{x}} != 3"
)


def test_six_trials_two_at_once_one_failing(shell: Shell) -> None:
    r = shell.run(
        "run", "-s", "slurm", "--wait", "--sweep", "x=0,1,2,3,4,5", "--max-parallel", "2",
        "utils.sh", "--cpu", "1", "--memMB", "100", TRIAL,
        timeout=180,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # a trial failed
    handle = r.stdout.strip()
    assert re.fullmatch(r"slurm://default/\d+", handle), r.stdout
    assert shell.counted("sbatch", "--parsable") == 1  # ONE submission for the six trials
    assert "6/6 done (1 failed)" in r.stderr and "ended FAILED" in r.stderr
    assert max_overlap(shell.cwd, 6) == 2  # %2: never more than two at once, and two did run

    shell.forget_calls()
    st = shell.run("status", handle)
    assert shell.counted("squeue") == 1  # the whole table from ONE squeue call
    table = rows(st.stdout)
    assert "Trials: 6 trials: 5 SUCCEEDED, 1 FAILED" in st.stdout
    job = handle.rsplit("/", 1)[1]
    for i in range(6):
        cells = table[i]
        assert cells[1] == str(i) and cells[-1] == f"{job}_{i}"
        assert cells[2] == ("FAILED" if i == 3 else "SUCCEEDED")
        assert cells[3] == ("1" if i == 3 else "0") and cells[4] in {"c1", "c2", "c3", "c4"}
    assert "trial 3: FAILED reason=NonZeroExitCode" in st.stdout

    for i in (0, 3):  # each trial's own log, its values in its env
        log = shell.run("log", f"{handle}/{i}")
        assert log.returncode == 0 and log.stdout == f"sh/0 trial {i} {i}/6 x={i}\n", log
    assert shell.run("log", f"{handle}/5/sh/0").stdout == "sh/0 trial 5 5/6 x=5\n"
    assert (shell.cwd / "slurm-logs" / job / "4" / "sh" / "0.stdout").read_text() == (
        "trial 4 4/6 x=4\n"
    )
    # the sweep's handle: every trial's lines, prefixed TRIAL/role/replica
    every = shell.run("log", handle, "--streams", "stdout")
    assert sorted(every.stdout.splitlines()) == [
        f"{i}/sh/0 trial {i} {i}/6 x={i}" for i in range(6)
    ]
    # a trial's handle: its status as an app's; the sweep's: its template and table
    one = shell.run("status", f"{handle}/3")
    assert one.stdout.startswith(f"Handle: {handle}/3\nState: FAILED\n"), one.stdout
    assert "NonZeroExitCode" in one.stdout
    desc = shell.run("describe", handle)
    assert "test {{x}} != 3" in desc.stdout and "# Trials: 6 trials: 5 SUCCEEDED" in desc.stdout

    listed = shell.run("list", "-s", "slurm").stdout.splitlines()
    mine = [ln for ln in listed if re.match(rf"slurm://default/{job}(_\d+)?\t", ln)]
    assert mine == [f"{handle}\tFAILED\tsh (sweep: SUCCEEDED=5,FAILED=1)"], listed


def test_cancel_one_trial_then_all(shell: Shell) -> None:
    r = shell.run(
        "run", "-s", "slurm", "--sweep", "x=0,1,2,3,4,5", "--max-parallel", "2",
        "utils.sh", "--cpu", "1", "--memMB", "100", "echo {{x}}; exec sleep 120",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    wait_for(lambda: list(states(shell, handle).values())[:2] == ["RUNNING"] * 2, 60, "2 running")
    assert set(list(states(shell, handle).values())[2:]) == {"PENDING"}

    assert shell.run("cancel", f"{handle}/0").returncode == 0  # a running trial
    assert shell.run("cancel", f"{handle}/5").returncode == 0  # one not started yet
    wait_for(lambda: states(shell, handle)[0] == "CANCELLED", 30, "trial 0 cancelled")
    wait_for(lambda: states(shell, handle)[2] == "RUNNING", 60, "trial 2 takes its place")
    now = states(shell, handle)
    assert now[1] == "RUNNING" and now[5] == "CANCELLED" and now[3] == now[4] == "PENDING"

    assert shell.run("cancel", handle).returncode == 0  # every trial
    wait_for(
        lambda: set(states(shell, handle).values()) == {"CANCELLED"}, 60, "every trial cancelled"
    )
    st = shell.run("status", handle).stdout
    assert "State: CANCELLED" in st and "6 trials: 6 CANCELLED" in st
    bad = shell.run("cancel", f"{handle}/6")
    assert bad.returncode == 2 and "has trials 0..5; no trial 6" in bad.stderr


WORKER = """\
import os, sys
keys = ("XRUN_SWEEP_LR", "XRUN_TRIAL_INDEX", "XRUN_SWEEP_SIZE", "RANK", "WORLD_SIZE")
print(" ".join(f"{k}={os.environ[k]}" for k in keys), "argv=" + ",".join(sys.argv[1:]),
      "node=" + os.environ["SLURMD_NODENAME"], flush=True)
"""


def test_two_node_ddp_trials(shell: Shell) -> None:
    """Each array task is a 2-node allocation with its own rendezvous (free port)."""
    (shell.cwd / "w.py").write_text(WORKER)
    r = shell.run(
        "run", "-s", "slurm", "--wait", "--sweep", "lr=0.5,0.25",
        "dist.ddp", "-j", "2x1", "--cpu", "1", "--memMB", "200", "--script", "w.py",
        "--", "--lr", "{{lr}}",
        timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    for i, lr in enumerate(("0.5", "0.25")):
        out = shell.run("log", f"{handle}/{i}", "--streams", "stdout").stdout
        lines = sorted(ln.split("]:", 1)[-1] for ln in out.splitlines() if "XRUN_SWEEP_LR" in ln)
        assert len(lines) == 2, out
        for rank, line in enumerate(lines):
            assert line.startswith(
                f"XRUN_SWEEP_LR={lr} XRUN_TRIAL_INDEX={i} XRUN_SWEEP_SIZE=2 RANK={rank} "
                f"WORLD_SIZE=2 argv=--lr,{lr}"
            ), line
        nodes = {ln.rsplit("node=", 1)[1] for ln in lines}
        assert len(nodes) == 2, lines  # two nodes per trial
