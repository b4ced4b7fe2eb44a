"""The log layout end to end: attempt dirs, tee prefixes, the local ranks filter."""

from __future__ import annotations

import os
from pathlib import Path

from tests.runtime.agent.helpers import BEHAVE, agent, events, run

# -- logs ----------------------------------------------------------------------------------------


def test_log_layout_tee_prefix_and_filter(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--rdzv-id",
            "ignored",
            "--log-dir",
            str(logs),
            "-t",
            "3",
            BEHAVE,
            str(tmp_path),
            "print:hello",
        )
    )
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[default0]:hello", "[default1]:hello"]
    assert "[default1]:err:hello" in p.stderr.splitlines()
    (run_dir,) = logs.iterdir()
    assert run_dir.name == events(tmp_path)[0]["TORCHELASTIC_RUN_ID"]
    for lr in (0, 1):
        d = run_dir / "attempt_0" / str(lr)
        assert (d / "stdout.log").read_text() == "hello\n"
        assert (d / "stderr.log").read_text() == "err:hello\n"

    out2 = tmp_path / "2"
    out2.mkdir()
    env = {**os.environ, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}>"}
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--role",
            "trainer",
            "--log-dir",
            str(logs),
            "-r",
            "2",
            "-t",
            "1",
            "--local-ranks-filter",
            "1",
            BEHAVE,
            str(out2),
            "print:x",
        ),
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["<trainer|1>x"]
    assert "err:x" not in p.stderr  # redirected to the file only
    run_dir2 = next(d for d in logs.iterdir() if d != run_dir)
    assert (run_dir2 / "attempt_0" / "0" / "stdout.log").read_text() == "x\n"  # files get all
    assert (run_dir2 / "attempt_0" / "0" / "stderr.log").read_text() == "err:x\n"


def test_a_temp_log_dir_is_removed_unless_a_worker_failed(tmp_path: Path) -> None:
    # Without --log-dir the agent makes $TMPDIR/xrun_*; a day of jobs used to leave hundreds.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    ok = run(agent("--nproc-per-node", "2", "-r", "3", BEHAVE, str(tmp_path), "print:x"), env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("x\n") == 0  # redirected: the files were there while it ran
    assert list(tmpdir.iterdir()) == []
    bad = run(
        agent("--nproc-per-node", "2", "-r", "3", BEHAVE, str(tmp_path), "exit-rank:0:3"), env=env
    )
    assert bad.returncode == 1, bad.stderr
    # The failure report points into the kept dir: the worker's stderr log is still there.
    [kept] = list(tmpdir.iterdir())
    assert kept.name.startswith("xrun_") and str(kept) in bad.stderr
    assert list(kept.glob("*/attempt_0/0/stderr.log"))
