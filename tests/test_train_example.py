"""examples/train_ddp.py: deterministic, atomic checkpoints, resume; unmodified under torchrun.

The resume tests run the script's ``main`` in this process (a process group of one, no launcher)
so torch is imported once; the torchrun test runs the real launcher with two workers. The
multi-process runs under xrun (including a worker SIGKILLed mid-run) are in test_local_e2e.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py"
ARGS = ["--epochs", "3", "--steps-per-epoch", "5"]


@pytest.fixture(scope="module")
def train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_ddp", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)


def _run(train: ModuleType, tmp_path: Path, ckpt: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out.json"
    try:
        assert train.main([*ARGS, "--checkpoint-dir", ckpt, "--out", str(out), *extra]) == 0
    finally:  # the script leaves the group to its process's exit; here the process goes on
        if train.dist.is_initialized():
            train.dist.destroy_process_group()
    return json.loads(out.read_text())


@pytest.mark.timeout(120)
def test_resumed_run_equals_undisturbed_bit_for_bit(
    train: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = _run(train, tmp_path, str(tmp_path / "a"))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "epoch-00001.pt", "epoch-00002.pt", "epoch-00003.pt"
    ]
    # Stop after epoch 1, then go on to 3 from the checkpoint.
    _run(train, tmp_path, str(tmp_path / "b"), "--epochs", "1")
    resumed = _run(train, tmp_path, str(tmp_path / "b"))
    assert "resuming after epoch 1" in capsys.readouterr().out
    assert resumed["params_sha256"] == whole["params_sha256"]
    assert resumed["final_loss"] == whole["final_loss"]
    # Nothing left to train: the same result again.
    again = _run(train, tmp_path, str(tmp_path / "b"))
    assert again["params_sha256"] == whole["params_sha256"]
    # A different seed really changes the result (the hash is not a constant).
    other = _run(train, tmp_path, str(tmp_path / "c"), "--seed", "1")
    assert other["params_sha256"] != whole["params_sha256"]


@pytest.mark.timeout(120)
def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one(
    train: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _run(train, tmp_path, "memory://whole")  # an fsspec URL works too
    real_save = train.torch.save
    calls = {"n": 0}

    def dying_save(obj: Any, f: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # epoch 2: half a file, then the "process dies"
            f.write(b"half a checkpoint")
            raise KeyboardInterrupt("killed while writing")
        real_save(obj, f)

    monkeypatch.setattr(train.torch, "save", dying_save)
    ckpt = tmp_path / "d"
    with pytest.raises(KeyboardInterrupt):
        _run(train, tmp_path, str(ckpt))
    names = sorted(p.name for p in ckpt.iterdir())
    assert names[0] == "epoch-00001.pt" and names[1].startswith("epoch-00002.pt.tmp-")
    assert len(names) == 2, "no complete epoch-2 checkpoint may exist"
    monkeypatch.setattr(train.torch, "save", real_save)
    resumed = _run(train, tmp_path, str(ckpt))
    assert resumed["params_sha256"] == whole["params_sha256"]


@pytest.mark.timeout(180)
def test_runs_unmodified_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(SCRIPT), *ARGS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert proc.stdout.count(f"params sha256 {result['params_sha256']}") == 2, proc.stdout
