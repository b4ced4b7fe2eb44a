"""Sweeps in the core: the grid, the sweep file, placeholders, the plan (one template or one
AppDef per trial), the status table; and every bad input through the real CLI: exit 2, one
line, nothing submitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.cli import Env, xrun
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.specs import AppDef, AppState, Role, appdef_to_dict
from xrun.sweeps.plan import (
    Sweep,
    SweepPlan,
    load_sweep_file,
    parse_sweep_flag,
    plan_from_app,
    plan_from_args,
    substitute,
    sweep_from_cli,
)
from xrun.sweeps.status import SweepStatus, TrialStatus, fold_state, format_duration


def ddp_maker():  # type: ignore[no-untyped-def]
    runner = Runner()
    calls: list[list[str]] = []

    def make(args: list[str]) -> AppDef:
        calls.append(list(args))
        return runner.component_app("dist.ddp", args)

    return make, calls


# --------------------------------------------------------------------------- the grid
def test_grid_is_the_cartesian_product_last_flag_fastest() -> None:
    sweep = sweep_from_cli(["lr=0.1,0.01,0.001", "wd=0,1e-4"], None, "2")
    trials = sweep.expand()
    assert len(trials) == 6 and sweep.max_parallel == 2
    assert trials[0] == {"lr": "0.1", "wd": "0"} and trials[1] == {"lr": "0.1", "wd": "1e-4"}
    assert trials[-1] == {"lr": "0.001", "wd": "1e-4"}
    assert sweep.names() == ["lr", "wd"]


def test_sweep_file_trials_times_the_grid(tmp_path: Path) -> None:
    f = tmp_path / "trials.yaml"
    f.write_text("- {opt: adam, lr: 0.1}\n- {opt: sgd, lr: 1}\n")
    sweep = sweep_from_cli(["seed=1,2"], str(f), None)
    trials = sweep.expand()
    assert [t["opt"] + t["seed"] for t in trials] == ["adam1", "adam2", "sgd1", "sgd2"]
    assert sweep.names() == ["opt", "lr", "seed"] and trials[2]["lr"] == "1"


def test_sweep_file_values_become_text(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text('[{"a": true, "b": 3, "c": 0.5, "d": "x y"}]')
    assert load_sweep_file(str(f)) == [{"a": "true", "b": "3", "c": "0.5", "d": "x y"}]


@pytest.mark.parametrize(
    "text,needle",
    [
        ("lr", "malformed"),
        ("=1,2", "malformed"),
        ("1lr=1", "not a valid sweep name"),
        ("lr=", "has no values"),
        ("lr=1,,2", "empty value"),
        ("l-r=1", "not a valid sweep name"),
    ],
)
def test_malformed_sweep_flag(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        parse_sweep_flag(text)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("", "expected a YAML list"),
        ("{lr: 1}", "expected a YAML list"),
        ("[]", "expected a YAML list"),
        ("- 1\n", "not a mapping"),
        ("- {lr: [1, 2]}\n", "not a plain value"),
        ("- {lr: 1}\n- {wd: 2}\n", "same names"),
        ("- {1x: 1}\n", "not a valid sweep name"),
        ("- [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_sweep_file(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(content)
    with pytest.raises(UsageError, match=needle):
        sweep_from_cli([], str(f), None)


def test_other_bad_sweeps(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="given twice"):
        sweep_from_cli(["a=1", "a=2"], None, None)
    with pytest.raises(UsageError, match="both become XRUN_SWEEP_LR"):
        sweep_from_cli(["lr=1", "LR=2"], None, None)
    with pytest.raises(UsageError, match="integer >= 1"):
        sweep_from_cli(["a=1"], None, "0")
    with pytest.raises(UsageError, match="cannot read"):
        sweep_from_cli([], str(tmp_path / "missing.yaml"), None)
    with pytest.raises(UsageError, match="at least one"):
        Sweep().expand()


# --------------------------------------------------------------------------- placeholders
def test_substitute_leaves_other_text_alone() -> None:
    assert substitute("--lr {{lr}} {{ wd }} {{other}} {x} $${y}", {"lr": "1", "wd": "2"}) == (
        "--lr 1 2 {{other}} {x} $${y}"
    )


def test_plain_values_use_one_template_verified_by_real_calls() -> None:
    make, calls = ddp_maker()
    sweep = Sweep(params={"lr": ["0.1", "0.01", "1e-4"], "wd": ["0", "5"]})
    plan = plan_from_args(make, ["--script", "t.py", "--", "--lr", "{{lr}}", "--wd={{wd}}"], sweep)
    assert plan.template is not None and plan.apps is None and len(plan) == 6
    assert "t.py --lr {{lr}} --wd={{wd}}" in plan.template.roles[0].args[-1]
    # one call with marker words, two real calls (first and last trial) that must agree
    assert len(calls) == 3 and calls[1][-2:] == ["0.1", "--wd=0"]
    app = plan.app(3)
    real = make(["--script", "t.py", "--", "--lr", "0.01", "--wd=5"])
    assert app.roles[0].args == real.roles[0].args
    assert app.roles[0].env == {
        **real.roles[0].env,
        "XRUN_SWEEP_LR": "0.01",
        "XRUN_SWEEP_WD": "5",
        "XRUN_TRIAL_INDEX": "3",
        "XRUN_SWEEP_SIZE": "6",
    }


def test_values_a_component_needs_itself_mean_one_appdef_per_trial() -> None:
    make, _ = ddp_maker()
    plan = plan_from_args(make, ["--script", "t.py", "-j", "{{n}}x2"], Sweep({"n": ["1", "2"]}))
    assert plan.template is None and plan.apps is not None
    assert [plan.app(i).roles[0].num_replicas for i in range(2)] == [1, 2]
    assert "reads a value itself" in plan.why_no_template


def test_values_that_need_quoting_mean_one_appdef_per_trial() -> None:
    make, _ = ddp_maker()
    plan = plan_from_args(
        make, ["--script", "t.py", "--", "--msg", "{{m}}"], Sweep({"m": ["a b", "it's"]})
    )
    assert plan.template is None and "not plain text" in plan.why_no_template
    assert plan.app(1).roles[0].args[-1].endswith("--msg 'it'\"'\"'s'")


def test_unknown_placeholder_and_a_bad_trial_are_usage_errors() -> None:
    make, calls = ddp_maker()
    with pytest.raises(UsageError, match=r"unknown placeholder \{\{wd\}\}"):
        plan_from_args(make, ["--script", "t.py", "--", "{{wd}}"], Sweep({"lr": ["1"]}))
    assert calls == []  # refused before the component ran
    with pytest.raises(UsageError, match=r"trial 1 \(n=x\)"):
        plan_from_args(make, ["--script", "t.py", "-j", "{{n}}x2"], Sweep({"n": ["1", "x"]}))


def test_env_only_parameters_need_no_placeholder() -> None:
    make, calls = ddp_maker()
    plan = plan_from_args(make, ["--script", "t.py"], Sweep({"seed": ["1", "2"]}))
    assert plan.template is not None and len(calls) == 1
    assert plan.app(1).roles[0].env["XRUN_SWEEP_SEED"] == "2"


def test_plan_from_an_appdef_and_its_json_round_trip() -> None:
    app = AppDef("a", [Role("r", "img", "echo", ["{{x}}", "${app_id}"], env={"X": "{{x}}"})])
    plan = plan_from_app(app, Sweep({"x": ["1", "2"]}))
    assert plan.app(1).roles[0].args == ["2", "${app_id}"]
    assert plan.app(1).roles[0].env["X"] == "2"
    back = SweepPlan.from_json(plan.to_json())
    assert appdef_to_dict(back.app(0)) == appdef_to_dict(plan.app(0))
    with pytest.raises(UsageError, match=r"unknown placeholder \{\{y\}\}"):
        plan_from_app(AppDef("a", [Role("r", "i", "echo", ["{{y}}"])]), Sweep({"x": ["1"]}))


# --------------------------------------------------------------------------- status
def test_fold_state() -> None:
    S = AppState
    assert fold_state([S.PENDING, S.PENDING]) == S.PENDING
    assert fold_state([S.SUCCEEDED, S.PENDING]) == S.RUNNING
    assert fold_state([S.SUCCEEDED, S.FAILED, S.CANCELLED]) == S.FAILED
    assert fold_state([S.SUCCEEDED, S.CANCELLED]) == S.CANCELLED
    assert fold_state([S.SUCCEEDED, S.SUCCEEDED]) == S.SUCCEEDED


def test_status_table() -> None:
    st = SweepStatus(
        handle="local_cwd://default/s",
        name="s",
        params=["lr"],
        trials=[
            TrialStatus(0, {"lr": "0.1"}, AppState.SUCCEEDED, 0, "c1", 100.0, 103.25, "a-0"),
            TrialStatus(1, {"lr": "0.01"}, AppState.FAILED, 3, "c2", 100.0, 230.0, "a-1", "boom"),
            TrialStatus(2, {"lr": "1"}, AppState.PENDING),
        ],
        max_parallel=2,
    )
    text = st.format(now=200.0)
    lines = text.splitlines()
    assert lines[0] == "State: RUNNING"
    assert lines[1] == "Trials: 3 trials: 1 SUCCEEDED, 1 FAILED, 1 PENDING"
    assert lines[3].split() == ["trial", "lr", "state", "exit", "host", "duration", "id"]
    assert lines[4].split() == ["0", "0.1", "SUCCEEDED", "0", "c1", "3.2s", "a-0"]
    assert lines[5].split() == ["1", "0.01", "FAILED", "3", "c2", "2m10s", "a-1"]
    assert lines[6].split() == ["2", "1", "PENDING"]
    assert lines[-1] == "trial 1: boom"
    assert format_duration(7500) == "2h05m" and format_duration(None) == ""


# --------------------------------------------------------------------------- bad input, CLI
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--sweep", "lr"], "--sweep 'lr' is malformed"),
        (["--sweep", "lr="], "has no values"),
        (["--sweep", "lr=1", "--max-parallel", "x"], "--max-parallel 'x' is invalid"),
        (["--sweep", "lr=1"], "unknown placeholder {{wd}}"),
        ([], "no sweep is given; add --sweep wd=V1,V2"),
        (["--sweep-file", "nope.yaml"], "cannot read --sweep-file 'nope.yaml'"),
        (["--sweep", "wd=1", "--log"], "--log streams one app's replicas"),
        (["--max-parallel", "2"], "a sweep needs at least one --sweep"),
    ],
)
def test_bad_input_exits_2_with_one_line_before_anything_runs(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    env = Env(tmp_path)
    state = tmp_path / "state"  # this test's own: nothing else writes there
    r = xrun(
        "run",
        *args,
        "utils.sh",
        "echo {{wd}}",
        cwd=env.cwd,
        env={**env.env, "XDG_STATE_HOME": str(state)},
    )
    assert r.returncode == 2, r
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("xrun: error: ") and needle in r.stderr, r.stderr
    assert _all_files(state) == []  # nothing recorded, nothing started


def test_multi_role_sweep_on_slurm_is_refused_at_dryrun(tmp_path: Path) -> None:
    env = Env(tmp_path)
    spec = tmp_path / "work" / "two.yaml"
    spec.write_text(
        "name: two\nroles:\n"
        "- {name: a, image: i, entrypoint: echo, args: ['{{x}}']}\n"
        "- {name: b, image: i, entrypoint: echo, args: ['{{x}}']}\n"
    )
    r = env.run("run", "--dryrun", "-s", "slurm", "--sweep", "x=1,2", "two.yaml")
    assert r.returncode == 2 and "2-role app (a, b)" in r.stderr and "-s local_cwd" in r.stderr
    ok = env.run("run", "--dryrun", "-s", "local_cwd", "--sweep", "x=1,2", "two.yaml")
    assert ok.returncode == 0, ok.stderr
    assert "# Sweep 'two': 2 trial(s) over x" in ok.stdout


def _all_files(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
