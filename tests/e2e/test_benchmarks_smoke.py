"""``python -m benchmarks --smoke`` runs every measure and writes well-formed JSON (one test
per measure, ``--only N``, plus one run of several measures into one document).

No time is asserted here (the machine running the suite is busy): only that the harness runs
each of the twenty measures (1-8 of issue #6, 9-10 of issue #18, 11-14 of issue #14, 15-16
of issue #24, 17-18 of issue #34, 19 of issue #33: one real preemption, C=2 s; 20 of issue #35;
21 of issues #34 and #35: one job per backend, a worker killed and a node lost; 22 of issue #36:
one call and a map of 10 on Slurm),
that every
contender has either figures or a stated reason, and that no xrun contender failed to do the job.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.slurm import SlurmCluster

# Each measure is its own test, so `pytest -n 2` spreads them over both workers instead of one
# worker running the whole smoke (~12 min at load) at the end of the suite. The longest:
# 19 (one real preemption per contender on the Slurm cluster, ~6 min at load), 15 and 16
# (faults on all three schedulers), 18 and 20 (recovery drills, ~2 min each), 21 (the drills on docker and slurm, ~5 min).
KEYS = [str(i) for i in range(1, 23)]
UNITS = ("s", "MiB", "x", "ops/s", "conn", "jobs", "aborts", "hits", "steps")


def _smoke(tmp_path: Path, only: str, timeout: float) -> tuple[dict, str]:
    out = tmp_path / "latest.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", only, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["smoke"] is True and doc["reps"] == 1
    assert doc["machine"]["cpus"] >= 1
    assert sorted(doc["measures"], key=int) == only.split(","), doc["measures"].keys()
    # Exactly the text table the lead copies figures from, one section per measure.
    for key in only.split(","):
        assert f"\n## {key}. " in proc.stdout
    return doc, proc.stdout


def test_the_smoke_tests_cover_every_measure() -> None:
    from benchmarks.__main__ import MEASURES

    assert sorted(MEASURES, key=int) == KEYS


def test_one_run_of_several_measures_writes_them_all_in_one_document(tmp_path: Path) -> None:
    doc, _ = _smoke(tmp_path, "5,9", timeout=600)
    assert doc["wall_s"] > 0 and set(doc["measures"]) == {"5", "9"}


@pytest.mark.timeout(1260)  # pytest's own bound over the subprocess's (below)
@pytest.mark.parametrize("key", KEYS)
def test_smoke_run_of_measure(
    key: str, tmp_path: Path, slurm_cluster: SlurmCluster, docker_engine: str
) -> None:
    # 19's real preemptions wait on Slurm's requeue hold, 21 a drill job on each of docker and
    # slurm; a busy box stretches every measure
    timeout = 1200 if key in ("19", "21") else 900
    doc, _ = _smoke(tmp_path, key, timeout=timeout)
    measure = doc["measures"][key]
    assert measure["title"] and measure["rows"], key
    for row in measure["rows"]:
        assert row["verdict"] in ("met", "missed", "n/a"), row
        assert row["unit"] in UNITS, row
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
    CHECKS.get(key, lambda m: None)(measure)


def _agent_and_floor(measure: dict) -> None:
    """xrun's agent and the floor exist wherever xrun is installed: they always have figures
    (torchrun, a reference, may fail on its own; its row then says why)."""
    for row in measure["rows"]:
        for name in ("xrun-agent", "floor"):
            res = row["contenders"].get(name, {"median": 0})
            assert "median" in res, (row["label"], name, res)


def _sweep_figures(name: str) -> Callable[[dict], None]:
    """The sweep measures (9, 10: the Slurm cluster is up) have xrun's figures too."""

    def check(measure: dict) -> None:
        for row in measure["rows"]:
            assert "median" in row["contenders"][name], row

    return check


def _reliability(measure: dict) -> None:
    """Issue #14's reliability smoke: no job failed, no worker aborted, under a port thief."""
    for row in measure["rows"]:
        assert row["contenders"]["xrun"]["median"] == 0, row


def _diagnosis(measure: dict) -> None:
    """Issue #24's diagnosis smoke: xrun's first screens named the rank and cause every time."""
    for row in measure["rows"]:
        assert row["verdict"] == "met", row


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


CHECKS: dict[str, Callable[[dict], None]] = {
    **{key: _agent_and_floor for key in ("1", "2", "3", "4", "7", "8")},
    "9": _sweep_figures("xrun sweep"),
    "10": _sweep_figures("xrun"),
    "14": _reliability,
    "15": _diagnosis,
    "16": _check_hang_autopsy,
    "19": _check_preemption,
}
