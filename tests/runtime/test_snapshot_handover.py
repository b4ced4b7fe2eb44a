"""``Snapshotter(replicated=True)``: a lost node's ranks get the step back from their peers.

Four real processes (2 "nodes" x 2 ranks, DDP over gloo on CPU), each node's snapshots in a dir
of its own on /dev/shm. A first run commits 3 steps and trains 2 more without committing (the
undisturbed reference). Then node 1's dir is wiped (its replacement's memory is empty) and the
four ranks start again in a re-formed world (``XRUN_ROUND=1``, no failure restart): every rank
must resume after step 3, the lacking ranks with node 0's model/optimizer state and their OWN
RNG state and ``extra`` (from their buddy's copy on node 0; rank 3's is over one message's
size), and 2 more steps must give the
reference's parameters and RNG draws bit for bit. Without the buddy copies, every rank falls
back to the disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS

WORKER = SCRIPTS / "handover_worker.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shm(tmp_path: Path) -> Any:
    d = Path("/dev/shm") / f"xrun-test-handover-{os.getpid()}-{tmp_path.name}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run(out: Path, phase: str, rnd: int, commits: int, more: int) -> list[dict[str, Any]]:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XRUN_", "TORCHELASTIC_"))}
    procs = []
    for rank in range(4):
        env = {
            **base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "WORLD_SIZE": "4", "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RESTART_COUNT": "0", "XRUN_ROUND": str(rnd), "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        argv = [sys.executable, str(WORKER), str(out), phase, str(commits), str(more)]
        procs.append(
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    for p in procs:
        text, _ = p.communicate(timeout=240)
        assert p.returncode == 0, text.decode(errors="replace")[-3000:]
    return [json.loads((out / f"{phase}-rank-{r}.json").read_text()) for r in range(4)]


@pytest.mark.timeout(600)
def test_a_lost_nodes_ranks_resume_from_their_peers_bit_for_bit(shm: Path) -> None:
    ref = run(shm, "a", 0, commits=3, more=2)
    assert [r["restored"] for r in ref] == ["fallback"] * 4
    assert sorted(p.name for p in (shm / "node-0" / "rank-0").iterdir()) == [
        "slot-0", "slot-1", "ward-0", "ward-1",
    ]  # fmt: skip
    shutil.rmtree(shm / "node-1")  # node 1 is lost; its replacement starts with nothing
    got = run(shm, "b", 1, commits=0, more=2)
    assert [r["restored"] for r in got] == [3] * 4
    # each rank its own extra (ranks 2 and 3 from their buddies on node 0)
    assert [r["extra"] for r in got] == [
        {"rank": r, "pos": 3, "pad": "x" * (70_000 if r == 3 else 10)} for r in range(4)
    ]
    for a, b in zip(ref, got, strict=True):
        assert b["step"] == a["step"] == 5
        assert b["params"] == a["params"], "the parameters differ from the undisturbed run's"
        assert b["next_draw"] == a["next_draw"], "a rank's RNG state was not its own"


@pytest.mark.timeout(600)
def test_without_a_copy_of_the_lost_ranks_part_every_rank_falls_back(shm: Path) -> None:
    run(shm, "a", 0, commits=2, more=0)
    shutil.rmtree(shm / "node-1")
    for ward in (shm / "node-0").glob("rank-*/ward-*"):
        ward.unlink()  # the buddy copies are gone too (say both nodes were each other's)
    got = run(shm, "b", 1, commits=0, more=0)
    assert [r["restored"] for r in got] == ["fallback"] * 4
