"""The slurm scheduler without a cluster: request values, the golden script, quoting, parsers.

The parsers read outputs recorded from the real 22.05 cluster (tests/fixtures/slurm/22.05,
re-record with tests/fixtures/slurm/record.sh) and hand-written 23.02/23.11/24.11 JSON in each
version's documented schema. ``XRUN_UPDATE_GOLDEN=1`` rewrites the golden scripts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import paths
from xrun.components.dist import ddp
from xrun.errors import UsageError
from xrun.schedulers.api import get_scheduler
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler, parse_version
from xrun.schedulers.slurm.options import SlurmOptions, WarningSignal, parse_signal
from xrun.schedulers.slurm.request import (
    ClusterInfo,
    build_request,
    format_comment,
    parse_comment,
    shell_word,
)
from xrun.schedulers.slurm.status import (
    SACCT_COMP_FIELDS,
    STATE_MAP,
    app_records,
    app_state,
    expand_hostlist,
    explain,
    fold_state,
    parse_sacct,
    parse_scontrol,
    parse_squeue_json,
    parse_squeue_text,
)
from xrun.schedulers.slurm.workspace import copy_workspace, is_ignored
from xrun.specs import AppDef, AppState, BindMount, Resource, Role, VolumeMount

FIXTURES = paths.FIXTURES / "slurm"
GOLDEN = FIXTURES / "golden"
CHDIR = "/home/u/proj"
PY_BIN = "/opt/venv/bin"


def request(app: AppDef, cfg: dict[str, object] | None = None, info: ClusterInfo | None = None):  # type: ignore[no-untyped-def]
    sched = create_scheduler("t")
    resolved = sched.run_opts().resolve(cfg or {}, "slurm")
    return build_request(app, resolved, CHDIR, info or ClusterInfo(), PY_BIN)


def ddp_app(**kw: object) -> AppDef:
    args = {"script": "train.py", "j": "2x2", "rdzv_port": 29500}
    args.update(kw)
    return ddp("--lr", "0.1", "it's a test", **args)  # type: ignore[arg-type]


def het_app() -> AppDef:
    return AppDef(
        name="het",
        roles=[
            Role(
                "ps",
                "",
                "python3",
                ["-m", "ps", "--id", "${replica_id}"],
                num_replicas=1,
                env={"ROLE_NOTE": "ps of ${app_id}"},
                resource=Resource(2, 0, 1000),
            ),
            Role(
                "worker",
                "",
                "python3",
                ["w.py", "--ps", "$${${rank0_env}}", "a b"],
                num_replicas=3,
                max_retries=2,
                env={"Q": 'it\'s "quoted" $HOME `x`'},
                resource=Resource(4, 1, 2000),
                mounts=[BindMount("/data", "/data", True)],
            ),
        ],
    )


# --------------------------------------------------------------------------- golden scripts
@pytest.mark.parametrize(
    "name,make",
    [("ddp_2x2", lambda: request(ddp_app())), ("het", lambda: request(het_app()))],
)
def test_golden_script(name: str, make) -> None:  # type: ignore[no-untyped-def]
    text = make().materialize()
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("XRUN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"golden {path} changed; XRUN_UPDATE_GOLDEN=1 to accept"


def test_single_role_is_one_homogeneous_allocation() -> None:
    req = request(ddp_app(max_retries=1))
    s = req.script
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in s
    assert "hetjob" not in s and "--het-group" not in s
    assert s.count("\nsrun ") == 1
    # --max_retries 1 of dist.ddp: its agents restart in place; the job requeues only when
    # preempted (once), never after a failure (that would make (N+1)^2 attempts).
    assert "#SBATCH --requeue" in s
    assert 'if [ "$XRUN_PREEMPTED" -eq 1 ]; then\n    XRUN_RETRIES=1\n' in s
    assert 'elif [ "$XRUN_RC" -ne 0 ]; then\n    XRUN_RETRIES=0\n' in s
    assert "#SBATCH --signal=B:USR2@90" in s
    assert f'export PATH={PY_BIN}:"$PATH"' in s
    assert "--comment" not in s  # on sbatch's command line (it may contain spaces)
    # The task, not the batch shell, expands these (accelerate#2816).
    assert "${XRUN_RANK0_HOST}:${XRUN_RDZV_PORT:-29500}" in s and "'\"${SLURM_JOB_ID}\"'" in s
    assert req.sbatch_argv == ["sbatch", "--parsable", "--comment=xrun:train;train=2"]
    assert req.roles == {"train": 2} and req.log_root == f"{CHDIR}/slurm-logs"


def test_het_job_has_one_component_and_srun_group_per_role() -> None:
    s = request(het_app()).script
    assert s.count("#SBATCH hetjob") == 1
    assert "srun --kill-on-bad-exit=1 --het-group=0 --ntasks-per-node=1 --cpus-per-task=2 " in s
    assert ": --het-group=1 --ntasks-per-node=1 --cpus-per-task=4 " in s
    assert "XRUN_REPLICA_ID=$((SLURM_PROCID - 0))" in s
    assert "XRUN_REPLICA_ID=$((SLURM_PROCID - 1))" in s  # the worker group starts after ps/0
    assert "#SBATCH --nodes=3" in s and "#SBATCH --mem=2000M" in s


def test_comment_carries_app_and_roles() -> None:
    comment = format_comment(het_app(), "exp 7")
    assert comment == "xrun:het;ps=1;worker=3,exp 7"
    assert parse_comment(comment) == ("het", {"ps": 1, "worker": 3})
    assert parse_comment("xrun:old") == ("old", {})
    assert parse_comment("someone else's job") is None


def test_elastic_role_asks_for_a_node_range() -> None:
    s = request(ddp_app(j="1:3x2")).script
    assert "#SBATCH --nodes=1-3\n#SBATCH --cpus-per-task" in s  # no --ntasks-per-node: see why
    assert "--gres=gpu:1" in request(ddp_app(j="1:3x2", gpu=1)).script
    # the survivors re-form the group, also when a node is lost (schedulers/slurm/losses.py)
    assert "srun --no-kill --kill-on-bad-exit=0 " in s and "#SBATCH --no-kill" in s
    assert "--kill-on-bad-exit=1" in request(ddp_app(j="3x2")).script


@pytest.mark.parametrize(
    "version,expected,absent",
    [
        ((22, 5), ["--gpus-per-task=2", "--ntasks=2"], "--gpus-per-node"),
        ((23, 11), ["--gpus-per-task=2", "--ntasks=2"], "--gpus-per-node"),
        ((24, 11), ["--gpus-per-node=2"], "--gpus-per-task"),
    ],
)
def test_gpu_flags_follow_the_slurm_version(version, expected, absent) -> None:  # type: ignore[no-untyped-def]
    s = request(ddp_app(gpu=2), info=ClusterInfo(version=version)).script
    for flag in expected:
        assert f"#SBATCH {flag}\n" in s
    assert absent not in s


def test_mem_skipped_when_nodes_report_no_real_memory() -> None:
    assert "--mem=1024M" in request(ddp_app(), info=ClusterInfo(node_mem_mb=2048)).script
    s = request(ddp_app(), info=ClusterInfo(node_mem_mb=1)).script
    assert "--mem=" not in s.replace("# --mem skipped", "")


def test_run_options_become_sbatch_lines() -> None:
    cfg = {
        "partition": "gpu",
        "time": "1:00:00",
        "account": "a",
        "qos": "high",
        "constraint": "a100",
        "mail_user": "me@x.org",
        "mail_type": "END,FAIL",
        "job_name": "jn",
        "exclusive": "true",
        "signal": "SIGUSR1@60",
        "comment": "exp7",
        "extra_sbatch_args": "--reservation=r1;--gres=gpu:2",
        "python_path": "",
    }
    s = request(ddp_app(), cfg).script
    for line in (
        "--partition=gpu",
        "--time=1:00:00",
        "--account=a",
        "--qos=high",
        "--constraint=a100",
        "--mail-user=me@x.org",
        "--mail-type=END,FAIL",
        "--job-name=jn",
        "--exclusive",
        "--signal=B:USR1@60",
        "--reservation=r1",
        "--gres=gpu:2",
    ):
        assert f"#SBATCH {line}\n" in s, line
    assert "trap 'xrun_on_signal USR1' USR1" in s and "PET_SIGNALS_TO_HANDLE" in s


def test_runopts_are_typed_and_reject_unknown_keys() -> None:
    opts = create_scheduler("t").run_opts()
    text = str(opts)
    for name in ("partition", "time", "job_dir", "signal", "extra_sbatch_args", "python_path"):
        assert name in text
    with pytest.raises(UsageError, match="unknown run option 'partiton'.*did you mean 'partition'"):
        opts.resolve({"partiton": "x"}, "slurm")


@pytest.mark.parametrize(
    "app,match",
    [
        (AppDef("a", [Role("r", "", "true", env={"BAD-NAME": "1"})]), "not a shell variable"),
        (
            AppDef("a", [Role("r", "", "true", mounts=[VolumeMount("v", "/x")])]),
            "cannot be honoured",
        ),
        (
            AppDef("a", [Role("r", "", "true", mounts=[BindMount("/a", "/b")])]),
            "src equals its dst",
        ),
    ],
)
def test_bad_roles_are_usage_errors(app: AppDef, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        request(app)


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="contains whitespace"):
        request(ddp_app(), {"partition": "a b"})
    with pytest.raises(UsageError, match="signal='USR9@1' is invalid; expected SIG@SECONDS"):
        request(ddp_app(), {"signal": "USR9@1"})
    assert parse_signal("B:SIGUSR2@90") == WarningSignal("USR2", "90")
    assert parse_signal("12@90") == WarningSignal("USR2", "90")
    assert parse_signal("") is None and SlurmOptions(signal=None).warning is None
    # parsed when the options are made: a bad value never reaches a request
    with pytest.raises(UsageError, match="signal='USR2@70000' is invalid"):
        SlurmOptions(signal="USR2@70000")
    assert SlurmOptions().warning == WarningSignal("USR2", "90")  # the default, USR2@90


# --------------------------------------------------------------------------- shellcheck
@pytest.fixture(scope="module")
def shellcheck() -> str:
    if shutil.which("shellcheck") is None:  # installs the cluster's packages, starts nothing
        script = FIXTURES.parents[1].parent / "scripts" / "slurm-cluster.sh"
        subprocess.run(["bash", str(script), "install"], check=True, timeout=600)
    path = shutil.which("shellcheck")
    assert path, "shellcheck missing: apt-get install shellcheck"
    return path


@pytest.mark.parametrize(
    "make",
    [
        lambda: request(ddp_app()),
        lambda: request(het_app()),
        lambda: request(
            ddp_app(env={"A": "x y", "B": "$HOME", "C": "'q'"}, mounts=None),
            {"signal": "", "python_path": ""},
        ),
    ],
    ids=["single-role", "het", "env-quotes-nosignal"],
)
def test_generated_scripts_pass_shellcheck(make, shellcheck: str) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [shellcheck, "-s", "bash", "-"], input=make().script, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


# --------------------------------------------------------------------------- quoting
def _bash_argv(words: str, env: dict[str, str]) -> list[str]:
    """What bash makes of ``words`` (NUL-separated argv), in the task's environment."""
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {words}"],
        capture_output=True,
        env={"PATH": os.environ["PATH"], **env},
        check=True,
    )
    return out.stdout.decode().split("\0")[:-1]


def test_shell_word_expands_task_macros_in_the_task() -> None:
    word = shell_word("id=${replica_id}/app=${app_id} $HOME `x` 'q' $${rank0_env}", "/img")
    got = _bash_argv(word, {"SLURM_JOB_ID": "77", "XRUN_REPLICA_ID": "3", "HOME": "/h"})
    assert got == ["id=3/app=77 $HOME `x` 'q' ${rank0_env}"]
    assert _bash_argv(shell_word("${img_root}/x ${rank0_env}", "/img"), {}) == [
        "/img/x XRUN_RANK0_HOST"
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40
    )
)
def test_shell_word_keeps_any_text_literal(text: str) -> None:
    literal = text.replace("$", "$$")  # escape macros: what comes back must be the text itself
    assert _bash_argv(shell_word(literal, "/img"), {}) == [text]


# --------------------------------------------------------------------------- no Slurm here
def test_missing_sbatch_is_a_usage_error_but_dryrun_works(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", str(tmp_path))  # a real shell with no Slurm commands on PATH
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")  # the dry run checks the job will find it
    sched = get_scheduler("slurm", "t")
    assert isinstance(sched, SlurmScheduler)
    info = sched.submit_dryrun(ddp_app(), {})
    assert str(info).startswith(
        "# submit: sbatch --parsable '--comment=xrun:train;train=2' < script\n#!/bin/bash\n"
    )
    with pytest.raises(UsageError) as e:
        sched.schedule(info)
    assert str(e.value) == "Slurm commands not found (sbatch); is this a Slurm login node?"
    with pytest.raises(UsageError, match=r"\(squeue\)"):
        sched.list()


def test_parse_version() -> None:
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5)
    assert parse_version("slurm 24.11.1") == (24, 11)
    assert parse_version("nonsense") == (0, 0)


# --------------------------------------------------------------------------- parsers
def _ids() -> dict[str, str]:
    return dict(line.split() for line in (FIXTURES / "22.05" / "ids.txt").read_text().splitlines())


@pytest.mark.parametrize("source", ["squeue.json", "squeue.txt", "scontrol.txt"])
def test_recorded_22_05_outputs(source: str) -> None:
    text = (FIXTURES / "22.05" / source).read_text()
    parse = {
        "squeue.json": parse_squeue_json,
        "squeue.txt": parse_squeue_text,
        "scontrol.txt": parse_scontrol,
    }[source]
    recs = parse(text)
    ids = _ids()
    expected = {
        "completed": AppState.SUCCEEDED,
        "failed": AppState.FAILED,
        "running": AppState.RUNNING,
        "pending": AppState.PENDING,
        "cancelled": AppState.CANCELLED,
        "signaled": AppState.FAILED,
        "het": AppState.SUCCEEDED,
        "requeued": AppState.PENDING,  # requeued by its own script, held ~120 s (BeginTime)
    }
    for name, state in expected.items():
        mine = app_records(recs, ids[name])
        assert mine, (name, source)
        assert fold_state(mine)[0] == state, (name, source)
        assert all(r.comment == f"xrun:{name}" for r in mine)
    het = app_records(recs, ids["het"])
    assert [r.het_offset for r in het] == [0, 1]
    assert het[1].job_id == str(int(ids["het"]) + 1)
    assert expand_hostlist(app_records(recs, ids["running"])[0].nodelist) == ["c1", "c2"]
    if source != "squeue.txt":  # text squeue has no exit codes
        failed = app_records(recs, ids["failed"])[0]
        assert failed.exit_code == 3 and "exit_code=3" in explain(failed)
        assert app_records(recs, ids["signaled"])[0].signal == 9
        requeued = app_records(recs, ids["requeued"])[0]
        assert requeued.restarts == 1 and requeued.reason == "BeginTime"


def test_recorded_22_05_sacct_from_jobcomp() -> None:
    recs = parse_sacct((FIXTURES / "22.05" / "sacct-c.txt").read_text(), SACCT_COMP_FIELDS)
    ids = _ids()
    assert app_state(app_records(recs, ids["failed"])[0].state) == AppState.FAILED
    assert app_state(app_records(recs, ids["cancelled"])[0].state) == AppState.CANCELLED


@pytest.mark.parametrize("version", ["22.05", "23.02", "23.11", "24.11"])
def test_squeue_json_across_versions(version: str) -> None:
    recs = parse_squeue_json((FIXTURES / version / "squeue.json").read_text())
    assert recs
    if version == "22.05":
        return  # recorded: covered above
    by_id = {r.app_id: r for r in recs if r.het_offset == 0}
    assert app_state(by_id["101"].state) == AppState.SUCCEEDED
    assert by_id["102"].exit_code == 3 and app_state(by_id["102"].state) == AppState.FAILED
    for jid, why in (
        ("103", "preempted"),
        ("104", "time limit"),
        ("105", "out of memory"),
        ("106", "node of the allocation failed"),
    ):
        assert app_state(by_id[jid].state) == AppState.FAILED
        assert why in explain(by_id[jid])
    assert by_id["105"].signal == 9
    assert app_state(by_id["107"].state) == AppState.PENDING and by_id["107"].restarts == 1
    het = app_records(recs, "108")
    assert [r.job_id for r in het] == ["108", "109"]
    assert expand_hostlist(het[1].nodelist) == ["n08", "n09"]
    assert fold_state(het)[0] == AppState.RUNNING
    assert app_state(by_id["110"].state) == AppState.CANCELLED
    assert by_id["111"].comment == ""


def test_every_slurm_state_maps() -> None:
    for name in (
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "RUNNING",
        "COMPLETING",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SUSPENDED",
        "CONFIGURING",
        "SPECIAL_EXIT",
    ):
        assert name in STATE_MAP and app_state(name) != AppState.UNKNOWN
    assert app_state("CANCELLED by 0") == AppState.CANCELLED
    assert app_state("WEIRD") == AppState.UNKNOWN
    assert app_state("") == AppState.UNKNOWN


def test_json_requeued_flag_means_pending() -> None:
    text = json.dumps({"jobs": [{"job_id": 5, "job_state": ["FAILED", "REQUEUED"]}]})
    assert app_state(parse_squeue_json(text)[0].state) == AppState.PENDING


def test_expand_hostlist() -> None:
    assert expand_hostlist("c[1-3,5],gpu01") == ["c1", "c2", "c3", "c5", "gpu01"]
    assert expand_hostlist("n[008-010]") == ["n008", "n009", "n010"]
    assert expand_hostlist("") == [] and expand_hostlist("(null)") == []


# --------------------------------------------------------------------------- workspace
def test_ignore_patterns() -> None:
    pats = [".git/", "*.bin", "/build", "data/**/raw", "!keep.bin", "logs/"]
    assert is_ignored("x.bin", False, pats) and not is_ignored("keep.bin", False, pats)
    assert is_ignored("build", True, pats) and not is_ignored("src/build", True, pats)
    assert is_ignored("data/a/b/raw", True, pats)
    assert is_ignored("logs", True, pats) and not is_ignored("logs", False, pats)
    assert is_ignored(".git", True, pats)


def test_copy_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("x")
    (ws / "pkg" / "m.py").write_text("m")
    (ws / "a.ckpt").write_text("c")
    (ws / ".gitignore").write_text("*.ckpt\n")
    copied = copy_workspace(str(ws), str(tmp_path / "job"))
    assert sorted(copied) == [".gitignore", "pkg/m.py"]
    assert (tmp_path / "job" / "pkg" / "m.py").read_text() == "m"
    with pytest.raises(UsageError, match="exists and is not empty"):
        copy_workspace(str(ws), str(tmp_path / "job"))


# --------------------------------------------------------------------------- describe/list, recorded
def _fake_slurm(tmp_path: Path, version: str, json_ok: bool) -> Path:
    """Executables named like Slurm's that print the recorded outputs of ``version``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    d = FIXTURES / version
    scripts = {
        "squeue": (
            f'case "$*" in *--json*) {"cat " + str(d / "squeue.json") if json_ok else "echo squeue: error: openapi plugin not found >&2; exit 1"};;\n'
            f"*) cat {d / 'squeue.txt'};; esac"
        ),
        "scontrol": f'grep -E "^JobId=$4 |HetJobId=$4 " {d / "scontrol.txt"} || {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }}',
        "sacct": 'echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1',
        "sbatch": 'echo "slurm 24.11.1"',
        "sinfo": "echo 64000",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("version", ["23.02", "23.11", "24.11"])
def test_describe_and_list_on_recorded_json(version: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path, version, True)}:/usr/bin:/bin")
    sched = create_scheduler("t")
    failed = sched.describe("102")
    assert failed is not None and failed.state == AppState.FAILED
    assert "exit_code=3" in failed.msg and failed.structured_error_msg
    oom = sched.describe("105")
    assert oom is not None and oom.state == AppState.FAILED and "out of memory" in oom.msg
    requeued = sched.describe("107")
    assert requeued is not None and requeued.state == AppState.PENDING
    assert requeued.num_restarts == 1
    het = sched.describe("108")
    assert het is not None and het.state == AppState.RUNNING
    assert sched.describe("4242") is None
    listed = {r.app_id: r for r in sched.list()}
    assert "111" not in listed  # no xrun: comment
    assert listed["108"].name == "het" and listed["108"].state == AppState.RUNNING
    assert listed["101"].app_handle == "slurm://t/101"
    assert sched.cluster_info(None, required=True) == ClusterInfo((24, 11), 64000)


def test_describe_without_squeue_json_uses_text_and_scontrol(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path, '22.05', False)}:/usr/bin:/bin")
    ids = _ids()
    sched = create_scheduler("t")
    failed = sched.describe(ids["failed"])
    assert failed is not None and failed.state == AppState.FAILED and "exit_code=3" in failed.msg
    assert sched._json_ok is False
    het = sched.describe(ids["het"])
    assert het is not None and het.state == AppState.SUCCEEDED
    running = sched.describe(ids["running"])
    assert running is not None and running.state == AppState.RUNNING


@pytest.mark.parametrize(
    "exit_text,app,expected",
    [
        ("143", AppState.CANCELLED, (AppState.CANCELLED, 143)),  # the cancel's SIGTERM
        ("0", AppState.CANCELLED, (AppState.SUCCEEDED, 0)),  # had finished before the cancel
        ("3", AppState.FAILED, (AppState.FAILED, 3)),
        ("0", AppState.RUNNING, (AppState.SUCCEEDED, 0)),
        (None, AppState.CANCELLED, (AppState.CANCELLED, None)),  # SIGKILLed with its wrapper
    ],
)
def test_replica_state_from_its_exit_file_and_the_apps_state(
    tmp_path: Path, exit_text: str | None, app: AppState, expected: tuple[AppState, int | None]
) -> None:
    base = tmp_path / "0"
    (tmp_path / "0.node").write_text("c2\n")
    if exit_text is not None:
        (tmp_path / "0.exit").write_text(exit_text + "\n")
    r = SlurmScheduler._replica(0, "trainer", str(base), ["c1"], app)
    assert (r.state, r.exit_code) == expected
    assert r.hostname == "c2" and r.role == "trainer"
