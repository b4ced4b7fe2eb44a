"""``python -m benchmarks --smoke`` runs every measure and writes well-formed JSON.

No time is asserted here (the machine running the suite is busy): only that the harness runs
each of the twenty measures (1-8 of issue #6, 9-10 of issue #18, 11-14 of issue #14, 15-16
of issue #24, 17-18 of issue #34, 19 of issue #33: one real preemption, C=2 s; 20 of issue #35),
that every
contender has either figures or a stated reason, and that no xrun contender failed to do the job.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.slurm import SlurmCluster


@pytest.mark.timeout(1830)
def test_smoke_run_emits_every_measure(
    tmp_path: Path, slurm_cluster: SlurmCluster, docker_engine: str
) -> None:
    out = tmp_path / "latest.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        # measures 17-18 (snapshot, warm recovery drill) added ~5 min at load (18's 2x2 row,
        # warm only, ~1 min more), 19 (one real preemption per contender on the Slurm
        # cluster) ~6 min, 20 (one node-loss drill, warm spare) ~2 min
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["smoke"] is True and doc["reps"] == 1
    assert doc["machine"]["cpus"] >= 1
    assert sorted(doc["measures"], key=int) == [str(i) for i in range(1, 21)]
    for key, measure in doc["measures"].items():
        assert measure["title"] and measure["rows"], key
        for row in measure["rows"]:
            assert row["verdict"] in ("met", "missed", "n/a"), row
            units = ("s", "MiB", "x", "ops/s", "conn", "jobs", "aborts", "hits", "steps")
            assert row["unit"] in units, row
            for name, res in row["contenders"].items():
                if "failed" in res:  # allowed for a reference such as torchrun, never for xrun
                    assert not name.startswith("xrun"), f"{key} {row['label']}: {name} {res}"
                    assert isinstance(res["failed"], str) and res["failed"], (key, name)
                    continue
                if "unavailable" in res:  # e.g. torchx, not installed here
                    assert isinstance(res["unavailable"], str) and res["unavailable"], (key, name)
                    continue
                assert res["n"] == len(res["samples"]) >= 1, (key, name, res)
                assert all(math.isfinite(v) for v in res["samples"]), (key, name, res)
                assert res["min"] <= res["median"] <= res["max"], (key, name, res)
    # xrun's agent and the floor exist wherever xrun is installed: they always have figures
    # (torchrun, a reference, may fail on its own; its row then says why).
    for key in ("1", "2", "3", "4", "7", "8"):
        for row in doc["measures"][key]["rows"]:
            for name in ("xrun-agent", "floor"):
                res = row["contenders"].get(name, {"median": 0})
                assert "median" in res, (key, row["label"], name, res)
    # Exactly the text table the lead copies figures from, one section per measure.
    # The sweep measures (9, 10: the Slurm cluster is up) have xrun's figures too.
    for key, name in (("9", "xrun sweep"), ("10", "xrun")):
        for row in doc["measures"][key]["rows"]:
            assert "median" in row["contenders"][name], (key, row)
    for i in range(1, 20):
        assert f"\n## {i}. " in proc.stdout
    _check_hang_autopsy(doc["measures"]["16"])
    # Issue #14's reliability smoke: no job failed, no worker aborted, under a port thief.
    for row in doc["measures"]["14"]["rows"]:
        assert row["contenders"]["xrun"]["median"] == 0, row
    # Issue #24's diagnosis smoke: xrun's first screens named the rank and cause every time.
    for row in doc["measures"]["15"]["rows"]:
        assert row["verdict"] == "met", row
    _check_preemption(doc["measures"]["19"])


def _check_hang_autopsy(measure: dict) -> None:
    """Issue #24's hang autopsy: xrun stacks and the watchdog's root cause in `xrun status`
    both named the hung rank, on local_cwd and on the suite's real docker and slurm."""
    for row in measure["rows"][:2]:
        for backend in ("local_cwd", "docker", "slurm"):
            assert row["contenders"][f"xrun {backend}"]["median"] == 0, row


def _check_preemption(measure: dict) -> None:
    """Issue #33's real preemption (K=1, C=2 s in smoke): xrun's job checkpointed the agreed
    step, lost no step, was requeued once and ended with the undisturbed run's parameters."""
    rows = {row["label"].split(" (")[0]: row for row in measure["rows"]}
    for label in (
        "preemptions ending in a complete checkpoint of one agreed step",
        "steps lost per preemption",
        "final parameters bit-identical to an undisturbed run",
        "logical runs",
        "double or lost requeues",
    ):
        assert rows[label]["verdict"] == "met", rows[label]
    assert "median" in rows["Slurm's hold of a requeued job"]["contenders"]["StartTime=now"]
