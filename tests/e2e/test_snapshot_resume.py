"""A SIGKILLed worker's job resumes from the shared-memory snapshot: 0 steps lost, same bits.

``examples/train_ddp.py --print-steps`` runs as a real local_cwd 1x2 job (``xrun run -s local_cwd
dist.ddp --max_retries 2``, real gloo). When rank 0 has printed ``step 14`` (mid-epoch 2), one
worker is SIGKILLed; the agent's ordinary cold restart starts both workers again, and they must
resume from the snapshots in /dev/shm (which outlive the workers), not from the epoch-1 disk
checkpoint. Asserted: the job succeeds; it says it resumed from shared memory after a step >= 14;
the ``step S`` lines are exactly 1..30, each once (no step trained twice: 0 steps lost, and
none skipped); the final parameters equal an undisturbed run's bit for bit; the snapshots
existed while the job ran and are gone once it ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import chaos
from tests.helpers.job_output import STEP_RE, finish, steps
from tests.helpers.paths import TRAIN, XRUN

EPOCHS, SPE, KILL_AT = 3, 10, 14
ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(SPE), "--step-sleep", "0.05"]


def _start(tmp: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp / f"{name}.json"
    argv = [
        XRUN, "run", "-s", "local_cwd", "-cfg", "stop_grace_s=2", "dist.ddp", "-j", "1x2",
        "--max_retries", "2", "--script", str(TRAIN), "--",
        *ARGS, "--print-steps", "--checkpoint-dir", str(tmp / f"{name}-ckpt"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, out


def _finish(proc: subprocess.Popen[str], lines: list[str], timeout: float = 200) -> str:
    return finish(proc, lines, timeout)


def _steps(text: str) -> list[int]:
    return steps(text)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("snap-ref")
    proc, out = _start(tmp, "ref")
    text = _finish(proc, [])
    assert _steps(text) == list(range(1, EPOCHS * SPE + 1)), text[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [0, 1])
def test_killed_worker_resumes_from_shared_memory(
    tmp_path: Path, undisturbed: dict[str, object], victim: int
) -> None:
    proc, out = _start(tmp_path, "kill")
    marker = str(tmp_path / "kill-ckpt")
    assert proc.stdout is not None
    lines: list[str] = []
    job_dir = None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if (m := STEP_RE.search(lines[-1])) and int(m[1]) == KILL_AT:
                break
        else:
            pytest.fail(f"the job ended before step {KILL_AT}:\n" + "\n".join(lines)[-3000:])
        workers = {w.rank: w for w in chaos.workers(marker)}
        assert sorted(workers) == [0, 1], workers
        env = chaos.environ(workers[victim].pid)
        run_id = env.get("XRUN_RUN_ID") or env["TORCHELASTIC_RUN_ID"]
        name = f"{run_id}@{env['XRUN_NODE_ID']}".replace("/", "_")  # one dir per node
        job_dir = Path("/dev/shm") / f"xrun-snapshots-{os.getuid()}" / name
        assert sorted(p.name for p in (job_dir / f"rank-{victim}").iterdir()) == [
            "slot-0",
            "slot-1",
        ]
        os.kill(workers[victim].pid, signal.SIGKILL)
    except BaseException:
        proc.kill()
        raise
    text = _finish(proc, lines)
    assert "started (restart 1)" in text, text[-3000:]
    resumed = re.findall(r"rank 0: resuming after step (\d+) from shared memory", text)
    assert len(resumed) == 1 and int(resumed[0]) >= KILL_AT, text[-3000:]
    assert "resuming after epoch" not in text, "resumed from the disk checkpoint"
    # Every step printed once: none trained twice (0 steps lost), none skipped. Only the step
    # it resumed after may lack its line: rank 0 prints a step after every rank committed it,
    # and a kill of rank 0 between the two loses the line, not the step (seen under load).
    every = list(range(1, EPOCHS * SPE + 1))
    after = int(resumed[0])
    assert _steps(text) in (every, [s for s in every if s != after]), text[-3000:]
    result = json.loads(out.read_text())
    assert result["restart_count"] == 1
    assert (result["params_sha256"], result["final_loss"]) == (
        undisturbed["params_sha256"],
        undisturbed["final_loss"],
    ), "the resumed run's parameters differ from the undisturbed run's"
    assert job_dir is not None and not job_dir.exists(), "snapshots outlived the job"
