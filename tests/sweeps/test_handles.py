"""The one resolver: any handle names an app, a sweep or a trial; every command takes all three
(``xrun status|log|describe|cancel``) and so does the Runner. Real local_cwd sweeps and apps."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import Env
from tests.helpers.waiting import wait_for
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.api import LogQuery
from xrun.specs import AppDef, AppState, AppStatus, Role
from xrun.sweeps import records
from xrun.sweeps.handles import AppTarget, SweepTarget, TrialTarget, resolve
from xrun.sweeps.plan import Sweep
from xrun.sweeps.status import SweepStatus

pytestmark = pytest.mark.timeout(180)


# --------------------------------------------------------------------------- the resolver
@pytest.fixture
def a_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A sweep record (no trials run): enough for the resolver to call the id a sweep."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    records.create("local_cwd", "s-sweep-abc", {"plan": {}})
    return "local_cwd://default/s-sweep-abc"


def test_resolve_app_sweep_and_trial(a_sweep: str) -> None:
    app = resolve("local_cwd://default/app-1", Runner().scheduler)
    assert (type(app), str(app), app.rest) == (AppTarget, "local_cwd://default/app-1", ())
    assert app.what() == "local_cwd://default/app-1"
    sweep = resolve(a_sweep, Runner().scheduler)
    assert (type(sweep), str(sweep), sweep.what()) == (
        SweepTarget,
        a_sweep,
        f"every trial of {a_sweep}",
    )
    trial = resolve(f"{a_sweep}/3", Runner().scheduler)
    assert isinstance(trial, TrialTarget)
    assert (str(trial), trial.trial, trial.what()) == (f"{a_sweep}/3", 3, f"trial 3 of {a_sweep}")
    target = resolve(f"{a_sweep}/3/trainer/0,1", Runner().scheduler, max_rest=2)
    assert isinstance(target, TrialTarget) and (target.trial, target.rest) == (
        3,
        ("trainer", "0,1"),
    )
    log_app = resolve("local_cwd://default/app-1/trainer/", Runner().scheduler, max_rest=2)
    assert (type(log_app), log_app.rest) == (AppTarget, ("trainer",))


def test_a_verb_that_does_not_apply_is_one_usage_line(a_sweep: str) -> None:
    """A sweep has no logs and no stacks of its own: the target says so, naming the trial form,
    before any scheduler is asked (the schedulers here would fail if one were)."""

    def no_scheduler(name: str, session: str) -> Any:
        raise AssertionError(f"asked scheduler {name}")

    sweep = resolve(a_sweep, no_scheduler)
    with pytest.raises(UsageError, match="its logs are its trials', name one as") as e:
        sweep.logs(LogQuery("trainer", 0))
    with pytest.raises(UsageError, match="name one of its trials") as e2:
        sweep.stacks(10.0)
    assert "\n" not in str(e.value) + str(e2.value) and f"{a_sweep}/TRIAL" in str(e.value)


@pytest.mark.parametrize(
    "text, max_rest, message",
    [
        ("not-a-handle", 0, "malformed app handle 'not-a-handle'"),
        ("local_cwd://default/app-1/extra", 0, "malformed app handle"),
        ("local_cwd://default/app-1/", 0, "malformed app handle"),
        ("local_cwd://default/app-1/r/0/x", 2, "nothing may follow the app here"),
        ("{sweep}/x", 0, "'x' is not a trial number"),
        ("{sweep}/٣", 0, "is not a trial number"),
        ("{sweep}/1/r", 0, "nothing may follow a trial here"),
    ],
)
def test_resolve_refuses_with_one_line(
    a_sweep: str, text: str, max_rest: int, message: str
) -> None:
    with pytest.raises(UsageError) as e:
        resolve(text.format(sweep=a_sweep), Runner().scheduler, max_rest)
    assert message in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- the CLI, for real
@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Env, str]:
    """A 3-trial local_cwd sweep of a 2-replica app, run to the end: trial i prints its word
    on stdout and one line on stderr; trial 2 fails (a second later, so that both replicas have
    printed before the failing one stops the other)."""
    env = Env(tmp_path_factory.mktemp("swept"))
    r = env.run(
        "run", "--sweep", "w=a,b,c", "--max-parallel", "3", "--wait", "utils.sh", "--cpu", "1",
        "--num_replicas", "2",
        'echo "word {{w}} from $XRUN_TRIAL_INDEX"; echo "err {{w}}" >&2; '
        "test {{w}} != c || { sleep 1; false; }",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # trial 2 failed
    handle = r.stdout.strip()
    assert re.fullmatch(r"local_cwd://default/sh-sweep-[a-z0-9]{8}", handle), r.stdout
    return env, handle


def test_log_of_a_sweep_prints_every_trial_prefixed(swept: tuple[Env, str]) -> None:
    env, handle = swept
    r = env.run("log", handle, "--streams", "stdout")
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert lines == sorted(
        f"{i}/sh/{k} word {w} from {i}" for i, w in enumerate("abc") for k in (0, 1)
    ), r.stdout
    # -f follows every trial until each has ended (they have: it returns), same lines
    followed = env.run("log", "-f", handle, "--streams", "stdout", timeout=60)
    assert sorted(followed.stdout.splitlines()) == lines
    # a trial's own replicas, and one role/replica of it
    one = env.run("log", f"{handle}/1/sh/1")
    assert sorted(one.stdout.splitlines()) == ["sh/1 err b", "sh/1 word b from 1"], one


def test_status_of_a_trial_is_its_app_status(swept: tuple[Env, str]) -> None:
    env, handle = swept
    ok = env.run("status", f"{handle}/0")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"Handle: {handle}/0\nState: SUCCEEDED\n"), ok.stdout
    assert "sh/0: SUCCEEDED host=localhost exit_code=0" in ok.stdout
    assert "sh/1: SUCCEEDED" in ok.stdout  # every replica, as for any app
    bad = env.run("status", f"{handle}/2")
    assert "State: FAILED" in bad.stdout and "exit_code=1" in bad.stdout, bad.stdout
    table = env.run("status", handle).stdout
    assert "Trials: 3 trials: 2 SUCCEEDED, 1 FAILED" in table, table
    missing = env.run("status", f"{handle}/3")
    assert missing.returncode == 2 and "has trials 0..2; no trial 3" in missing.stderr


def test_describe_of_a_sweep_and_of_a_trial(swept: tuple[Env, str]) -> None:
    env, handle = swept
    sweep = env.run("describe", handle)
    assert sweep.returncode == 0, sweep.stderr
    assert "test {{w}} != c" in sweep.stdout  # the template AppDef, placeholders kept
    assert "# Trials: 3 trials: 2 SUCCEEDED, 1 FAILED" in sweep.stdout  # and the trial table
    trial = env.run("describe", f"{handle}/1")
    assert trial.returncode == 0, trial.stderr
    assert "test b != c" in trial.stdout and "{{w}}" not in trial.stdout  # trial 1's own
    assert "# State: SUCCEEDED" in trial.stdout


def test_runner_verbs_take_any_handle(
    swept: tuple[Env, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, handle = swept
    monkeypatch.setenv("HOME", str(env.home))
    monkeypatch.chdir(env.cwd)
    with Runner() as runner:
        sweep = runner.status(handle)
        assert isinstance(sweep, SweepStatus) and len(sweep.trials) == 3
        trial = runner.status(f"{handle}/1")
        assert isinstance(trial, AppStatus) and trial.state == AppState.SUCCEEDED
        assert [r.role for r in trial.roles] == ["sh"]
        app = runner.describe(f"{handle}/2")
        assert app is not None and "test c != c" in app.roles[0].args[-1]
        lines = list(runner.log_lines(f"{handle}/0", "sh", 1, streams=None))
        assert sorted(lines) == ["err a\n", "word a from 0\n"]
        # the trial's own app handle (what `xrun list` hides under the sweep) works as well
        assert sweep.trials[0].app_id
        own = runner.status(f"local_cwd://default/{sweep.trials[0].app_id}")
        assert isinstance(own, AppStatus) and own.state == AppState.SUCCEEDED
        with pytest.raises(UsageError, match="its logs are its trials'"):
            runner.log_lines(handle, "sh", 0)


def test_cancel_says_what_it_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    app = AppDef("nap", [Role("nap", "", "sh", ["-c", "sleep 60"])])
    with Runner() as runner:
        handle = runner.run_sweep(app, Sweep({"n": ["1", "2"]}, max_parallel=2), "local_cwd")
        wait_for(
            lambda: all(t.app_id for t in runner.status(handle).trials),  # type: ignore[union-attr]
            30,
            "both trials started",
        )
        runner.cancel(f"{handle}/0")
        st = runner.wait(f"{handle}/0", timeout=30)
        assert st is not None and st.state == AppState.CANCELLED
        other = runner.status(f"{handle}/1")
        assert other is not None and other.state == AppState.RUNNING
        runner.cancel(handle)
        done = runner.wait(handle, timeout=60)
        assert isinstance(done, SweepStatus)
        assert [t.state for t in done.trials] == [AppState.CANCELLED] * 2
