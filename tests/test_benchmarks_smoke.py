"""``python -m benchmarks --smoke`` runs every measure and writes well-formed JSON.

No time is asserted here (the machine running the suite is busy): only that the harness runs
each of the eight measures, that every contender has either figures or a stated reason, and that
no xrun contender failed to do the job.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(420)
def test_smoke_run_emits_every_measure(tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["smoke"] is True and doc["reps"] == 1
    assert doc["machine"]["cpus"] >= 1
    assert sorted(doc["measures"], key=int) == [str(i) for i in range(1, 9)]
    for key, measure in doc["measures"].items():
        assert measure["title"] and measure["rows"], key
        for row in measure["rows"]:
            assert row["verdict"] in ("met", "missed", "n/a"), row
            assert row["unit"] in ("s", "MiB", "x"), row
            for name, res in row["contenders"].items():
                if "unavailable" in res:
                    reason = res["unavailable"]
                    assert isinstance(reason, str) and reason, (key, name)
                    assert not (name.startswith("xrun") and reason.startswith("failed")), (
                        f"measure {key} {row['label']}: {name} {reason}")
                    continue
                assert res["n"] == len(res["samples"]) >= 1, (key, name, res)
                assert all(math.isfinite(v) for v in res["samples"]), (key, name, res)
                assert res["min"] <= res["median"] <= res["max"], (key, name, res)
    # The contenders that are always installed here have figures in every launch measure.
    for key in ("1", "2", "4"):
        row = doc["measures"][key]["rows"][0]
        for name in ("torchrun", "xrun-agent"):
            assert "median" in row["contenders"][name], (key, name, row["contenders"][name])
    # Exactly the text table the lead copies figures from, one section per measure.
    for i in range(1, 9):
        assert f"\n## {i}. " in proc.stdout
