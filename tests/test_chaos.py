"""Chaos training on local_cwd (issue #7 item 1): SIGKILLed workers and agents lose nothing.

``examples/train_ddp.py`` (deterministic, atomic checkpoints, resume) runs through the real
``xrun run -s local_cwd dist.ddp`` CLI while ``chaos_driver.Chaos`` SIGKILLs its processes.

* 2x2 with ``--max_retries``: three workers, chosen at random (seeded), are SIGKILLed at random
  moments after a checkpoint. Asserted: the job succeeds; its final parameters (sha256 in the
  ``--out`` JSON) equal an undisturbed 2x2 run's bit for bit; every checkpoint file the driver
  saw under its final name loaded with ``torch.load`` (never half-written); and no temp file is
  left behind except by a writer the driver killed mid-write.
* elastic ``1:2x2``: the agent that does not host the rendezvous store (the one with the higher
  ranks) is SIGKILLed. Asserted: the job still succeeds, finishing at world size 2, and its
  final parameters equal those of an undisturbed 2-worker run started from the undisturbed
  4-worker run's checkpoint of the epoch the survivors resumed from (so the result depends on
  the world sizes and the resize point only, never on timing).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import chaos_driver as chaos
import pytest

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "examples" / "train_ddp.py")
XRUN = str(Path(sys.executable).parent / "xrun")
EPOCHS = 10
# Small and quick: an epoch is ~0.2-0.4 s, so the kills land inside training, not start-up.
TRAIN_ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", "10", "--step-sleep", "0.02"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def xrun_ddp(tmp: Path, name: str, jobspec: str, *, retries: int = 0, timeout: float = 150,
             chaos_run: chaos.Chaos | None = None) -> tuple[dict[str, object], str]:
    """Run train_ddp through ``xrun run -s local_cwd dist.ddp`` in ``tmp``; return the --out
    JSON and the CLI's output. ``chaos_run`` (started here) acts while the job runs."""
    out = tmp / f"{name}.json"
    port = free_port()
    argv = [XRUN, "run", "-s", "local_cwd", "-cfg", "stop_grace_s=2", "dist.ddp", "-j", jobspec,
            "--max_retries", str(retries), "--rdzv_port", str(port), "--script", TRAIN, "--",
            *TRAIN_ARGS, "--checkpoint-dir", str(tmp / f"{name}-ckpt"), "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    if chaos_run is not None:
        chaos_run.rdzv_port = port
        chaos_run.start()
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        chaos.kill_all(str(tmp / f"{name}-ckpt"))
        proc.kill()
        text, _ = proc.communicate()
        pytest.fail(f"{name}: the job did not end within {timeout} s; output:\n{text[-4000:]}")
    finally:
        if chaos_run is not None:
            chaos_run.stop.set()
            chaos_run.join(10)
    assert proc.returncode == 0, f"{name}: xrun run exited {proc.returncode}:\n{text[-4000:]}"
    return json.loads(out.read_text()), text


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    """The undisturbed 2x2 run: its result and its checkpoint dir (one per epoch)."""
    tmp = tmp_path_factory.mktemp("chaos-ref")
    result, _ = xrun_ddp(tmp, "ref", "2x2")
    assert result["world_size"] == 4
    return result, tmp / "ref-ckpt"


def _assert_checkpoints_sound(driver: chaos.Chaos, ckpt: Path) -> None:
    assert driver.error is None, f"the chaos driver crashed: {driver.error!r}"
    assert not driver.load_errors, f"half-written checkpoints seen: {driver.load_errors}"
    assert driver.loaded >= EPOCHS, f"the driver loaded only {driver.loaded} checkpoint versions"
    killed = {k.pid for k in driver.done}
    left = [n for n in os.listdir(ckpt) if chaos.TMP_RE.match(n)]
    # A temp file may survive only its writer's SIGKILL mid-write (it is never renamed then).
    stray = [n for n in left if int(chaos.TMP_RE.match(n)[1]) not in killed]  # type: ignore[index]
    assert not stray, f"temp checkpoint files left behind by live writers: {stray}"


@pytest.mark.timeout(240)
def test_sigkilled_workers_change_nothing(tmp_path: Path, reference: tuple) -> None:
    ref, _ = reference
    marker = str(tmp_path / "chaos-ckpt")
    driver = chaos.Chaos(marker=marker, ckpt_dir=Path(marker), kills=3, seed=7, nworkers=4)
    result, text = xrun_ddp(tmp_path, "chaos", "2x2", retries=6, chaos_run=driver)
    kills = "\n".join(f"  {k.what} after epoch {k.at_epoch}" for k in driver.done)
    assert len(driver.done) == 3, f"only {len(driver.done)} kills happened:\n{kills}\n{text[-3000:]}"
    assert result["world_size"] == 4
    assert result["params_sha256"] == ref["params_sha256"], (
        f"parameters differ from the undisturbed run after the kills:\n{kills}")
    assert result["final_loss"] == ref["final_loss"]
    # The kills did force restarts (each resumed from a checkpoint, not from scratch).
    assert len(re.findall(r"rank 0: resuming after epoch \d+", text)) >= 3, text[-3000:]
    _assert_checkpoints_sound(driver, Path(marker))
    assert not chaos.agents(marker) and not chaos.workers(marker), "processes outlived the job"
