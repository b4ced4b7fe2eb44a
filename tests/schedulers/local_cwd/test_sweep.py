"""Sweeps on local_cwd, for real: the ``xrun`` CLI, the detached sweep supervisor, each trial
a dist.ddp app with xrun's runtime agent and a real worker (tests/scripts/sweep_trial.py, which
records when it ran and what it saw)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from xrun.runner import Runner
from xrun.specs import AppDef, AppState, Role
from xrun.sweeps.plan import Sweep

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path)
    shutil.copy(SCRIPTS / "sweep_trial.py", e.cwd / "trial.py")
    (e.cwd / "out").mkdir()
    return e


def ddp_sweep(env: Env, *sweep: str, seconds: float = 1.5, extra: tuple[str, ...] = ()) -> str:
    r = env.run(
        "run", *sweep, "dist.ddp", "-j", "1x1", "--cpu", "1", *extra, "--script", "trial.py",
        "--", "out", str(seconds), "--lr", "{{lr}}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    assert re.fullmatch(r"local_cwd://default/trial-sweep-[a-z0-9]{8}", handle), r.stdout
    return handle


def status(env: Env, handle: str) -> tuple[str, dict[int, list[str]]]:
    r = env.run("status", handle)
    assert r.returncode == 0, r.stderr
    rows = {
        int(c[0]): c for c in (ln.split() for ln in r.stdout.splitlines()) if c and c[0].isdigit()
    }
    return r.stdout, rows


def wait_ended(env: Env, handle: str, timeout: float = 90) -> str:
    wait_for(lambda: "State: RUNNING" not in status(env, handle)[0]
             and "State: PENDING" not in status(env, handle)[0], timeout, f"{handle} ends")  # fmt: skip
    return status(env, handle)[0]


def max_overlap(out: Path, n: int) -> int:
    events = []
    for i in range(n):
        events += [(float((out / f"start.{i}").read_text()), 1)]
        events += [(float((out / f"end.{i}").read_text()), -1)]
    running = most = 0
    for _, step in sorted(events):
        running += step
        most = max(most, running)
    return most


def test_four_trials_at_most_two_at_once(env: Env) -> None:
    handle = ddp_sweep(env, "--sweep", "lr=0.1,0.01,0.001,1e-4", "--max-parallel", "2")
    # `xrun run` returned with the handle while the trials run on (its supervisor is detached)
    text, rows = status(env, handle)
    assert "State: SUCCEEDED" not in text and any(
        r[2] in ("RUNNING", "PENDING") for r in rows.values()
    )
    text = wait_ended(env, handle)
    assert "State: SUCCEEDED" in text and "Trials: 4 trials: 4 SUCCEEDED" in text, text
    out = env.cwd / "out"
    assert max_overlap(out, 4) == 2
    for i, lr in enumerate(("0.1", "0.01", "0.001", "1e-4")):
        seen = json.loads((out / f"env.{i}.0.0.json").read_text())
        assert seen["argv"] == ["--lr", lr]  # the placeholder's value, on the command line
        assert seen["env"] == {  # and in the worker's env
            "XRUN_SWEEP_LR": lr,
            "XRUN_TRIAL_INDEX": str(i),
            "XRUN_SWEEP_SIZE": "4",
        }
    _, rows = status(env, handle)
    for i, cells in rows.items():
        assert cells[2:5] == ["SUCCEEDED", "0", "localhost"] and cells[5].endswith("s")
        log = env.run("log", f"{handle}/{i}/trial/0", "--streams", "stdout")
        assert f"trial {i} args --lr {cells[1]}" in log.stdout, log
    desc = env.run("describe", handle).stdout
    assert "trial.py out 1.5 --lr {{lr}}" in desc and "# Trials: 4 trials: 4 SUCCEEDED" in desc
    listed = env.run("list").stdout.splitlines()
    assert f"{handle}\tSUCCEEDED\ttrial (sweep: SUCCEEDED=4)" in listed
    assert not [ln for ln in listed if any(c[-1] in ln for c in rows.values())]  # no trial apps


def test_a_failed_trial_does_not_stop_the_others_and_wait_says_so(env: Env) -> None:
    r = env.run(
        "run", "--wait", "--sweep", "rc=0,3,0", "--max-parallel", "3",
        "dist.ddp", "-j", "1x1", "--cpu", "1", "--env", "XRUN_SWEEP_RC={{rc}}",
        "--script", "trial.py", "--", "out", "1",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "3/3 done (1 failed), 0 running, 0 pending" in r.stderr
    _, rows = status(env, r.stdout.strip())
    assert [rows[i][2] for i in range(3)] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert rows[1][3] == "1"  # the agent's exit code
    ok = env.run("run", "--wait", "--sweep", "rc=0,0", "utils.sh", "exit {{rc}}")
    assert ok.returncode == 0 and "ended SUCCEEDED: 2 trials: 2 SUCCEEDED" in ok.stderr


def test_max_retries_is_per_trial(env: Env) -> None:
    """--max_retries {{r}}: a typed option, so the component builds each trial's AppDef."""
    r = env.run(
        "run", "--wait", "--sweep", "r=0,1", "--max-parallel", "2",
        "dist.ddp", "-j", "1x1", "--cpu", "1", "--max_retries", "{{r}}",
        "--env", "XRUN_SWEEP_FAIL_FIRST=1", "--script", "trial.py", "--", "out", "0",
    )  # fmt: skip
    assert r.returncode == 1
    _, rows = status(env, r.stdout.strip())
    assert rows[0][2] == "FAILED" and rows[1][2] == "SUCCEEDED"
    assert (env.cwd / "out" / "env.1.0.1.json").exists()  # trial 1 restarted once
    assert not (env.cwd / "out" / "env.0.0.1.json").exists()


def test_cancel_one_trial_then_all(env: Env) -> None:
    handle = ddp_sweep(env, "--sweep", "lr=1,2,3,4,5", "--max-parallel", "2", seconds=60)
    wait_for(lambda: [status(env, handle)[1][i][2] for i in (0, 1)] == ["RUNNING"] * 2, 30)
    assert env.run("cancel", f"{handle}/4").returncode == 0  # not started yet
    assert env.run("cancel", f"{handle}/0").returncode == 0  # running
    _, rows = status(env, handle)
    assert rows[0][2] == "CANCELLED" and rows[4][2] == "CANCELLED"
    wait_for(lambda: status(env, handle)[1][2][2] == "RUNNING", 30, "trial 2 takes its place")
    assert status(env, handle)[1][1][2] == "RUNNING"
    t0 = time.monotonic()
    assert env.run("cancel", handle).returncode == 0
    text, rows = status(env, handle)
    assert [rows[i][2] for i in range(5)] == ["CANCELLED"] * 5 and "State: CANCELLED" in text
    assert time.monotonic() - t0 < 30  # it did not wait for the 60 s trials
    assert not (env.cwd / "out" / "start.3").exists()  # trial 3 never ran


def test_default_parallel_and_dryrun_of_a_large_grid(env: Env) -> None:
    cpus = len(os.sched_getaffinity(0))
    r = env.run(
        "run", "--dryrun", "--sweep", f"a={','.join(map(str, range(100)))}",
        "--sweep", f"b={','.join(map(str, range(100)))}",
        "dist.ddp", "-j", "1x1", "--cpu", "1", "--script", "trial.py", "--", "{{a}}", "{{b}}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert head == (
        f"# Sweep 'trial': 10000 trial(s) over a, b; at most {cpus} trial(s) at once (this "
        f"machine has {cpus} CPU(s) and each trial asks for 1 (1 x 1); --max-parallel K to "
        "change)."
    )
    table = [ln.split() for ln in r.stdout.splitlines()[2:10002]]
    assert table[0] == ["#", "0", "0", "0"] and table[-1] == ["#", "9999", "99", "99"]
    assert "trial.py {{a}} {{b}}" in r.stdout  # the template, once
    assert "XRUN_TRIAL_INDEX=0" in r.stdout  # trial 0's request (its env)


def test_python_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = AppDef(
        "api", [Role("echo", "", "sh", ["-c", "echo {{word}}-$XRUN_SWEEP_WORD | tee {{word}}.txt"])]
    )
    with Runner() as runner:
        handle = runner.run_sweep(
            app, Sweep({"word": ["a", "b", "c"]}, max_parallel=3), "local_cwd"
        )
        st = runner.wait(handle, timeout=60)
        assert st is not None and st.state == AppState.SUCCEEDED, st
        assert [t.values["word"] for t in st.trials] == ["a", "b", "c"]
        assert {t.state for t in st.trials} == {AppState.SUCCEEDED}
        lines = list(runner.log_lines(f"{handle}/1", "echo", 0))
    for w in "abc":
        assert (tmp_path / f"{w}.txt").read_text() == f"{w}-{w}\n"
    assert lines == ["b-b\n"]


def test_log_follow_waits_for_a_trial_that_has_not_started(env: Env) -> None:
    r = env.run(
        "run", "--sweep", "n=1,2", "--max-parallel", "1", "utils.sh", "--cpu", "1",
        "sleep 2; echo trial {{n}} done",
    )  # fmt: skip
    handle = r.stdout.strip()
    now = env.run("log", f"{handle}/1")
    assert now.returncode == 0 and now.stdout == ""
    assert f"trial 1 of {handle} has not run (PENDING); -f waits for it" in now.stderr
    followed = env.run("log", "-f", f"{handle}/1", timeout=60)
    assert followed.returncode == 0 and followed.stdout == "sh/0 trial 2 done\n", followed
    wait_for(lambda: status(env, handle)[1][1][2] == "SUCCEEDED", 10, "trial 1 recorded")
