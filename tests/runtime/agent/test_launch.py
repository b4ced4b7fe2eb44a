"""``xrun.runtime.launch``: the agent as a Python call, with function workers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import xrun.runtime
from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS
from xrun.runtime import ChildFailedError, LaunchConfig, launch

sys.path.insert(0, str(SCRIPTS))  # spawned workers inherit sys.path and import launch_fns
import launch_fns  # noqa: E402


def test_returns_values_by_global_rank() -> None:
    assert launch(LaunchConfig(nproc_per_node=2), launch_fns.scaled_rank)(10) == {0: 0, 1: 10}


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_function_workers_never_see_the_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, method: str
) -> None:
    (tmp_path / "token").write_text("s3cret")
    monkeypatch.setenv("XRUN_RDZV_TOKEN", "s3cret")
    monkeypatch.setenv("XRUN_RDZV_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("XRUN_TEST_VISIBLE", "yes")
    run = launch(LaunchConfig(nproc_per_node=1, start_method=method), launch_fns.env_var)
    assert run("XRUN_RDZV_TOKEN") == {0: None}
    assert run("XRUN_RDZV_TOKEN_FILE") == {0: None}
    assert run("XRUN_TEST_VISIBLE") == {0: "yes"}  # the rest of the env does get through


def test_binary_entrypoint_returns_none_per_rank() -> None:
    assert launch(LaunchConfig(nproc_per_node=2), "/bin/true")() == {0: None, 1: None}
    with pytest.raises(ChildFailedError, match=r"exitcode  : 1 \(pid"):
        launch(LaunchConfig(nproc_per_node=1), "/bin/false")()


def test_restart_after_one_failed_attempt() -> None:
    cfg = LaunchConfig(nproc_per_node=2, max_restarts=1)
    assert launch(cfg, launch_fns.fail_on_first_attempt)() == {0: "1", 1: "1"}


def test_failure_raises_with_the_summary(tmp_path: Path) -> None:
    cfg = LaunchConfig(nproc_per_node=2, log_dir=str(tmp_path))
    with pytest.raises(ChildFailedError) as info:
        launch(cfg, launch_fns.always_fail)()
    msg = str(info.value)
    assert "Root Cause (first observed failure):" in msg and "always_fail FAILED" in msg
    assert "ValueError: rank" in msg and "is broken" in msg  # the @record traceback
    assert set(info.value.failures) <= {0, 1} and info.value.failures
    assert info.value.exitcode == 1


def test_two_agents_in_threads() -> None:
    port = free_port()
    cfg = LaunchConfig(
        min_nodes=2,
        max_nodes=2,
        nproc_per_node=2,
        run_id="threads",
        rdzv_endpoint=f"127.0.0.1:{port}",
    )
    results: list[dict[int, Any]] = []
    threads = [
        threading.Thread(target=lambda: results.append(launch(cfg, launch_fns.scaled_rank)(1)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results, key=lambda r: min(r)) == [{0: 0, 1: 1}, {2: 2, 3: 3}]


def test_cli_and_launch_give_the_same_worker_env(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "xrun.runtime",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            str(SCRIPTS / "env_dump.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    cli = {r: json.loads((tmp_path / f"{r}.0.json").read_text()) for r in (0, 1)}
    lib = launch(LaunchConfig(nproc_per_node=2, max_restarts=1), launch_fns.env_of_worker)()
    for r in (0, 1):
        a, b = cli[r], lib[r]
        assert set(b) == set(launch_fns.KEYS)
        for k in launch_fns.KEYS:
            if k == "MASTER_PORT":
                assert a[k].isdigit() and b[k].isdigit()
            elif k == "TORCHELASTIC_RUN_ID":  # random for standalone jobs
                assert len(a[k]) == len(b[k]) == 36
            elif k == "TORCHELASTIC_ERROR_FILE":  # <tmp log dir>/<run_id>/attempt_0/<r>/error.json
                assert (
                    a[k].split("/")[-3:]
                    == b[k].split("/")[-3:]
                    == ["attempt_0", str(r), "error.json"]
                )
            else:
                assert a[k] == b[k], k


def test_import_is_lazy() -> None:
    code = (
        "import sys, xrun.runtime; "
        "print(sorted(m for m in sys.modules if m.startswith('xrun.runtime.')))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.stdout.strip() == "[]"
    assert xrun.runtime.record is launch_fns.record
