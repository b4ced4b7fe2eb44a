"""Reading back what tests/scripts/stop_drill.py's ranks wrote: one place for the stop drills
of every scheduler (local_cwd, docker, slurm). What each drill asserts: every rank saw the stop
request, within a second of the first one (and of the signal, where the test sent it), every
rank stopped after the same step, the agreed one, and its checkpoint is complete."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for

DRILL = SCRIPTS / "stop_drill.py"
ROLE = DRILL.stem  # a dist.ddp of the drill names its role after the script


@dataclass
class Stopped:
    step: int  # the one step every rank stopped after
    spread: float  # seconds between the first and the last rank seeing the request
    lag: float | None  # seconds from the signal to the last rank seeing it (None: not sent here)


def wait_ready(out: Path, ranks: int, timeout: float = 180) -> None:
    """Until every rank trains (generous: torch starts slowly on a busy machine)."""
    wait_for(lambda: len(list(out.glob("ready.*"))) == ranks, timeout=timeout, what="ranks ready")


def check_stopped(out: Path, ranks: int, t0: float | None = None, within: float = 1.0) -> Stopped:
    """What the drill asserts once the job has stopped; ``t0``: when the test sent the stop."""
    seen = {int(p.name.split(".")[1]): float(p.read_text()) for p in out.glob("seen.*")}
    assert sorted(seen) == list(range(ranks)), f"ranks that saw the stop request: {sorted(seen)}"
    spread = max(seen.values()) - min(seen.values())
    assert spread <= within, f"the ranks saw the stop request {spread:.2f} s apart: {seen}"
    lag = None if t0 is None else max(seen.values()) - t0
    if lag is not None:
        assert lag <= within, f"the last rank saw the stop request {lag:.2f} s after the signal"
    stopped = {r: json.loads((out / f"stopped.{r}.json").read_text()) for r in range(ranks)}
    ckpts = {r: json.loads((out / f"ckpt.{r}.json").read_text()) for r in range(ranks)}
    steps = {s["step"] for s in stopped.values()}
    assert len(steps) == 1, f"the ranks stopped after different steps: {stopped}"
    assert {s["agreed"] for s in stopped.values()} == steps, stopped
    assert ckpts == stopped, f"a checkpoint is not the one its rank saved: {ckpts} vs {stopped}"
    assert not list(out.glob("*.tmp")), "a checkpoint was left half-written"
    return Stopped(steps.pop(), spread, lag)


def drill_lines(log: str, what: str) -> list[int]:
    """The steps in ``rank R: <what> S`` lines of a log (what: "stopping at step",
    "resuming from step")."""
    import re

    return [int(m) for m in re.findall(rf"^(?:\[\w+\]:)?rank \d+: {what} (\d+)", log, re.M)]


# examples/train_ddp.py's stop recipe: short epochs, slow enough steps to be stopped mid-epoch.
EXAMPLE_ARGS = ["--epochs", "3", "--steps-per-epoch", "20", "--print-steps"]


def example_reference(tmp: Path) -> str:
    """The final parameters' sha256 of an undisturbed 4-worker run of examples/train_ddp.py
    (one runtime agent here; the result depends on the world size only). Computed once per
    test process: every scheduler's drill compares against the same run."""
    if _EXAMPLE_REFERENCE:
        return _EXAMPLE_REFERENCE[0]
    import subprocess
    import sys

    from tests.helpers.paths import TRAIN

    out = tmp / "reference.json"
    proc = subprocess.run(
        [sys.executable, "-m", "xrun.runtime", "--nproc-per-node", "4", str(TRAIN),
         *EXAMPLE_ARGS, "--checkpoint-dir", str(tmp / "reference-ckpt"), "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _EXAMPLE_REFERENCE.append(str(json.loads(out.read_text())["params_sha256"]))
    return _EXAMPLE_REFERENCE[0]


_EXAMPLE_REFERENCE: list[str] = []


def example_stop_and_resume(log: str) -> int:
    """The one step a stopped and resumed run of the example stopped after and resumed from."""
    import re

    stops = re.findall(r"^(?:\[\w+\]:)?stopping at step (\d+): checkpoint saved$", log, re.M)
    resumes = re.findall(r"^(?:\[\w+\]:)?resuming from step (\d+)$", log, re.M)
    assert len(stops) == 1 and stops == resumes, f"stops {stops}, resumes {resumes}:\n{log}"
    return int(stops[0])
