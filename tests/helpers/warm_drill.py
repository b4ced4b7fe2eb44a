"""The ``--recover warm`` drill of every scheduler (issue #34): ``examples/train_ddp.py`` as a real
2x2 ``dist.ddp --recover warm`` job; once both nodes' pools are full, one worker of the SECOND
node (a replica that does not serve the store) is SIGKILLed mid-training
(tests/scripts/kill_worker.py, run where that node's agent runs). What each scheduler's test
asserts, read back from the job's logs and its ``--out`` file:

* the job succeeds; the agent saw the kill (``killed by SIGKILL``);
* both nodes replaced their workers from their warm pools (``2 of 2 workers started warm``);
* the ranks resumed from the snapshots in shared memory, after a step at or past the one the
  test waited for, never from the disk checkpoint;
* every ``step S`` line is there exactly once: 0 steps lost (none trained twice), none skipped;
* the final parameters are bit-identical to an undisturbed run's;
* on this host (local_cwd, Slurm): the pool's interpreters and the snapshots in /dev/shm that
  the workers had mapped while they trained are gone once the job ended.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.paths import SCRIPTS, TRAIN

KILLER = SCRIPTS / "kill_worker.py"
EPOCHS, SPE = 3, 50
# 150 steps of >= 0.4 s: >= 60 s of training, time for both pools to fill (a few seconds to
# ~30 s on a busy 2-core machine) before the kill, and steps left after it.
ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(SPE), "--print-steps"]
SLEEP = ["--step-sleep", "0.4"]
WAIT_STEP = 5  # the test waits for this step before it arms the kill
_STEP = re.compile(r"(?:^|\]:)step (\d+)$", re.M)


def reference(tmp: Path) -> str:
    """The final parameters' sha256 of an undisturbed 4-worker run (one agent, no sleeps: the
    result depends on the world size only). Computed once per test process: every drill of
    every scheduler compares against the same run."""
    if _REFERENCE:
        return _REFERENCE[0]
    out = tmp / "reference.json"
    proc = subprocess.run(
        [sys.executable, "-m", "xrun.runtime", "--nproc-per-node", "4", str(TRAIN), *ARGS,
         "--checkpoint-dir", str(tmp / "reference-ckpt"), "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _REFERENCE.append(str(json.loads(out.read_text())["params_sha256"]))
    return _REFERENCE[0]


_REFERENCE: list[str] = []


def steps(log: str) -> list[int]:
    return [int(s) for s in _STEP.findall(log)]


def check(log: str, result: Path, ref: str) -> int:
    """Asserts what the drill promises (see the module's doc); the step it resumed after."""
    assert "killed by SIGKILL" in log, log[-4000:]
    assert log.count("2 of 2 workers started warm (--recover warm)") == 2, log[-4000:]
    resumed = re.findall(r"rank 0: resuming after step (\d+) from shared memory", log)
    assert len(resumed) == 1 and int(resumed[0]) >= WAIT_STEP, log[-4000:]
    assert "resuming after epoch" not in log, "resumed from the disk checkpoint"
    # Every step printed once; only the step it resumed after may lack its line: rank 0 prints
    # a step after every rank committed it, and the survivors are SIGKILLed at once under
    # --recover warm, so rank 0 can die between the commit and the print (seen on Slurm under
    # load: step 9 done, resumed after 9, no "step 9" line). Nothing was trained twice or lost.
    every = list(range(1, EPOCHS * SPE + 1))
    after = int(resumed[0])
    assert steps(log) in (every, [s for s in every if s != after]), steps(log)
    got = json.loads(result.read_text())
    assert got["params_sha256"] == ref, "the recovered run's parameters differ from the reference"
    return int(resumed[0])


def armed(out: str) -> dict[str, list[int] | list[str] | int]:
    """kill_worker.py's report (its last line): its pool pids, the workers' snapshot dirs."""
    report: dict[str, list[int] | list[str] | int] = json.loads(out.strip().splitlines()[-1])
    return report


def _pool_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return b"warm_child.py" in argv and stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def check_gone(report: dict[str, list[int] | list[str] | int], within: float = 60) -> None:
    """The job's pool interpreters and snapshot folders (on this host) went with the job."""
    pool, snaps = report["pool"], report["snapshots"]
    assert isinstance(pool, list) and isinstance(snaps, list)
    assert pool and snaps, f"nothing seen while the job ran: {report}"
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pool if _pool_alive(int(p))] + [d for d in snaps if os.path.exists(d)]
        if not left:
            return
        assert time.monotonic() < deadline, f"outlived the job: {left}"
        time.sleep(0.5)
