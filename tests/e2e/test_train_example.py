"""examples/train_ddp.py: deterministic, atomic checkpoints, resume; unmodified under torchrun.

Every run is its own process (a process group of one, no launcher). Running ``main`` in the test
process instead would be faster, but with torch 2.13 freeing a DDP model deadlocks now and then
(the Reducer's destructor joins gloo's threads while holding the GIL), so the script leaves with
``os._exit`` and the tests leave it to do so. The torchrun test runs the real launcher with two
workers; the multi-process runs under xrun (a worker SIGKILLed mid-run) are in test_local_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import TRAIN

SCRIPT = TRAIN
ARGS = ["--epochs", "3", "--steps-per-epoch", "5"]

# Runs the script as __main__; with a number N > 0, the N-th torch.save writes half a file and
# the process dies on the spot (os._exit: no cleanup, like a SIGKILL mid-write).
DRIVER = """\
import os, runpy, sys

script, crash_at = sys.argv[1], int(sys.argv[2])
sys.argv = [script, *sys.argv[3:]]
if crash_at:
    import torch
    real_save, calls = torch.save, [0]
    def dying_save(obj, f):
        calls[0] += 1
        if calls[0] == crash_at:
            f.write(b"half a checkpoint")
            f.flush()
            os._exit(17)
        real_save(obj, f)
    torch.save = dying_save
runpy.run_path(script, run_name="__main__")
"""


def _run(
    tmp_path: Path, ckpt: str, *extra: str, crash_at: int = 0
) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "WORLD_SIZE",
            "RANK",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT",
        )
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(SCRIPT),
            str(crash_at),
            *ARGS,
            "--checkpoint-dir",
            ckpt,
            "--out",
            str(tmp_path / "out.json"),
            *extra,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )


def _result(tmp_path: Path, ckpt: str, *extra: str) -> dict[str, Any]:
    proc = _run(tmp_path, ckpt, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    result["stdout"] = proc.stdout
    return result


@pytest.mark.timeout(240)
def test_resumed_run_equals_undisturbed_bit_for_bit(tmp_path: Path) -> None:
    whole = _result(tmp_path, str(tmp_path / "a"))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "epoch-00001.pt",
        "epoch-00002.pt",
        "epoch-00003.pt",
    ]
    # Stop after epoch 1, then go on to 3 from the checkpoint.
    _result(tmp_path, str(tmp_path / "b"), "--epochs", "1")
    resumed = _result(tmp_path, str(tmp_path / "b"))
    assert "resuming after epoch 1" in resumed["stdout"]
    assert resumed["params_sha256"] == whole["params_sha256"]
    assert resumed["final_loss"] == whole["final_loss"]
    # Nothing left to train: the same result again.
    again = _result(tmp_path, str(tmp_path / "b"))
    assert again["params_sha256"] == whole["params_sha256"]
    # A different seed really changes the result (the hash is not a constant).
    other = _result(tmp_path, str(tmp_path / "c"), "--seed", "1")
    assert other["params_sha256"] != whole["params_sha256"]


@pytest.mark.timeout(240)
def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path: Path) -> None:
    whole = _result(tmp_path, "memory://whole")  # an fsspec URL works too
    ckpt = tmp_path / "d"
    died = _run(tmp_path, str(ckpt), crash_at=2)  # dies while writing epoch 2
    assert died.returncode == 17, died.stderr[-3000:]
    names = sorted(p.name for p in ckpt.iterdir())
    assert names[0] == "epoch-00001.pt" and names[1].startswith("epoch-00002.pt.tmp-")
    assert len(names) == 2, "no complete epoch-2 checkpoint may exist"
    resumed = _result(tmp_path, str(ckpt))
    assert "resuming after epoch 1" in resumed["stdout"]
    assert resumed["params_sha256"] == whole["params_sha256"]


@pytest.mark.timeout(180)
def test_runs_unmodified_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(SCRIPT),
            *ARGS,
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert proc.stdout.count(f"params sha256 {result['params_sha256']}") == 2, proc.stdout


def test_a_stop_at_an_epochs_end_resumes_from_the_stops_checkpoint(tmp_path: Path) -> None:
    """Stopped at step 20 of 20 per epoch: both checkpoints hold step 20; the resume says it
    came from the stop's (seen in a Slurm preemption test that stopped at step 20)."""
    code = f"""
import contextlib, io, runpy, fsspec, torch
m = runpy.run_path({str(SCRIPT)!r}, run_name="train_ddp")
fs, root = fsspec.filesystem("file"), {str(tmp_path / "ckpt")!r}
model = m["make_model"](0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
m["save_checkpoint"](fs, root, 1, model)
m["save_stop_checkpoint"](fs, root, 20, model, opt)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    step = m["resume_from_disk"](fs, root, 20, model, opt)
print(step, out.getvalue().strip())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "20 resuming from step 20", r.stdout
