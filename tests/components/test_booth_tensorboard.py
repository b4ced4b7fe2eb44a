"""``utils.booth`` and ``metrics.tensorboard`` (TorchX's builtins; their AppDefs are compared
with TorchX's recorded ones in tests/core/test_torchx_differential.py) run for real on
local_cwd: booth stores its result where TorchX's FsspecResultTracker reads it, and the real
TensorBoard serves a run's scalars until the exit file appears."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from tests.helpers.net import free_port
from xrun.config import Config
from xrun.runner import Runner
from xrun.specs import AppState


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with Runner(config=Config()) as r:
        yield r


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["path", "memory"])
def test_booth_stores_the_value_as_torchx_s_result_tracker(
    runner: Runner, tmp_path: Path, where: str
) -> None:
    base = str(tmp_path / "trials") if where == "path" else "memory://booth-trials"
    args = ["--x1", "1", "--x2", "3", "--trial_idx", "4", "--tracker_base", base]
    if where == "memory":  # another process's memory:// is not ours: check in-process instead
        from xrun.components._apps import main

        assert main(["booth", *args[:-2], "--tracker_base", base]) == 0
    else:
        handle = runner.run_component("utils.booth", args, "local_cwd")
        final = runner.wait(handle, timeout=30)
        assert final is not None and final.state == AppState.SUCCEEDED, final
        assert "booth(1, 3) = 0 (trial 4)\n" in list(runner.log_lines(handle, "torchx-utils-booth"))
    # what FsspecResultTracker(base)[4] reads: the JSON document at key "4" of the mapper
    assert json.loads(fsspec.get_mapper(base)["4"]) == {"booth_eval": 0.0}


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.timeout(120)
def test_tensorboard_serves_the_logdir_until_the_exit_file(runner: Runner, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "tb"
    with SummaryWriter(str(logdir / "run1")) as w:
        for step in range(3):
            w.add_scalar("loss", 1.0 / (step + 1), step)
    port, done = free_port(), tmp_path / "done"
    args = ["--logdir", str(logdir), "--port", str(port), "--exit_on_file", str(done)]
    handle = runner.run_component("metrics.tensorboard", args, "local_cwd")
    deadline = time.monotonic() + 60
    runs: object = None
    while time.monotonic() < deadline:
        try:
            runs = _get(f"http://127.0.0.1:{port}/data/runs")
            if runs:
                break
        except OSError:
            pass
        time.sleep(0.5)
    assert runs == ["run1"], runs
    scalars = _get(f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=run1&tag=loss")
    assert [row[1:] for row in scalars] == [[0, 1.0], [1, 0.5], [2, pytest.approx(1 / 3)]]  # type: ignore[union-attr]
    st = runner.status(handle)
    assert st is not None and st.state == AppState.RUNNING
    done.write_text("")
    final = runner.wait(handle, timeout=30)  # the monitor looks every 5 s
    assert final is not None and final.is_terminal()
    text = "".join(runner.log_lines(handle, "tensorboard"))
    assert f"{done} exists, terminating..." in text, text
