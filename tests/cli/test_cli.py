"""End to end: the real ``xrun`` console script in a subprocess.

Each test gets its own HOME and cwd so that no real ``~/.xrunconfig`` leaks in.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.paths import REPO, XRUN
from xrun.cli.logprint import LogPrinter, LogTarget
from xrun.cli.run_args import REQUEST_MARKER
from xrun.schedulers.api import LogQuery
from xrun.specs import AppDef, appdef_from_yaml


@pytest.fixture
def cli(tmp_path: Path) -> Env:
    return Env(tmp_path)


def split_dryrun(stdout: str) -> tuple[AppDef, str]:
    """The AppDef (parsed back from the YAML part) and the scheduler request text."""
    yaml_part, marker, request = stdout.partition(REQUEST_MARKER)
    assert marker, stdout
    return appdef_from_yaml(yaml_part), request


@pytest.mark.parametrize(
    "j, nnodes, nproc, replicas, min_replicas, endpoint",
    [
        ("1x2", "1:1", 2, 1, 1, "localhost:0"),
        ("2x4", "2:2", 4, 2, 2, "${XRUN_RANK0_HOST}:${XRUN_RDZV_PORT:-29500}"),
        ("1:3x2", "1:3", 2, 3, 1, "${XRUN_RANK0_HOST}:${XRUN_RDZV_PORT:-29500}"),
    ],
)
def test_dryrun(
    cli: Env, j: str, nnodes: str, nproc: int, replicas: int, min_replicas: int, endpoint: str
) -> None:
    r = cli.run(
        "run", "--dryrun", "-s", "local_cwd", "dist.ddp", "-j", j, "--script", "t.py", "x y"
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    app, request = split_dryrun(r.stdout)
    role = app.roles[0]
    assert (role.num_replicas, role.min_replicas) == (replicas, min_replicas)
    cmd = role.args[1]
    assert f"--nnodes {nnodes} --nproc-per-node {nproc} " in cmd and cmd.endswith("t.py 'x y'")
    # the request is after macro substitution: the env var's name, one command per replica
    assert f"--rdzv-endpoint {endpoint} " in request
    assert request.count("xrun.runtime") == replicas
    assert "${app_id}" not in request and "${rank0_env}" not in request


def test_saved_dryrun_yaml_runs_again(cli: Env) -> None:
    first = cli.run("run", "--dryrun", "dist.ddp", "-j", "2x2", "--script", "t.py", "--env", "A=1")
    app, _ = split_dryrun(first.stdout)
    (cli.cwd / "spec.yaml").write_text(first.stdout.partition(REQUEST_MARKER)[0])
    again = cli.run("run", "--dryrun", "spec.yaml")
    assert again.returncode == 0, again.stderr
    assert split_dryrun(again.stdout)[0] == app
    assert app.roles[0].env == {
        "A": "1",
        "LOGLEVEL": "WARNING",
        "TORCHX_TRACKING_EXPERIMENT_NAME": "default-experiment",
    }
    bad = cli.run("run", "--dryrun", "spec.yaml", "--extra")
    assert bad.returncode == 2 and "takes no arguments" in bad.stderr


def test_builtins_and_print(cli: Env) -> None:
    r = cli.run("builtins")
    assert r.returncode == 0
    for name in ("dist.ddp", "dist.spmd", "utils.echo", "utils.copy"):
        assert f"  {name} " in r.stdout
    r = cli.run("builtins", "--print", "dist.ddp")
    assert r.returncode == 0 and "def ddp(" in r.stdout and "import" in r.stdout
    # A usable template: saved anywhere, it runs as a component (no relative imports left).
    assert "from ." not in r.stdout
    (cli.cwd / "mine.py").write_text(r.stdout)
    r = cli.run("run", "--dryrun", "mine.py:ddp", "-j", "2x2", "--script", "t.py")
    assert r.returncode == 0 and "--nnodes 2:2" in r.stdout, r.stderr


def test_component_help(cli: Env) -> None:
    r = cli.run("run", "dist.ddp", "--help")
    assert r.returncode == 0
    assert "(default: None)" in r.stdout and "-j, --j J (str)" in r.stdout
    assert "(required)" not in r.stdout  # every ddp parameter has a default
    assert "[[MIN:]NNODES x]NPROC" in r.stdout


def test_runopts(cli: Env) -> None:
    r = cli.run("runopts", "local_cwd")
    assert r.returncode == 0 and r.stdout.startswith("local_cwd:\n") and "log_dir" in r.stdout
    everything = cli.run("runopts")
    assert everything.returncode == 0 and "local_cwd:" in everything.stdout


def test_config_precedence_through_the_cli(cli: Env) -> None:
    (cli.home / ".xrunconfig").write_text(
        "[component:dist.ddp]\nj = 2x2\nmemMB = 77\n[local_cwd]\nlog_dir = /home-logs\n"
    )
    (cli.cwd / ".xrunconfig").write_text("[component:dist.ddp]\nj = 1:3x2\n")

    def dry(*extra: str) -> tuple[AppDef, str]:
        r = cli.run("run", "--dryrun", *extra[:2], "dist.ddp", "--script", "t.py", *extra[2:])
        assert r.returncode == 0, r.stderr
        return split_dryrun(r.stdout)

    app, request = dry()
    assert app.roles[0].num_replicas == 3  # cwd beats home
    assert app.roles[0].resource.memMB == 77  # home beats the component default
    assert "/home-logs/" in request
    app, request = dry("-cfg", "log_dir=/cli-logs", "-j", "2x4")
    assert app.roles[0].num_replicas == 2 and "--nproc-per-node 4" in app.roles[0].args[1]
    assert "/cli-logs/" in request and "/home-logs" not in request  # command line beats files


BAD_RUNS: list[tuple[list[str], str]] = [
    *[
        (["run", "--dryrun", "dist.ddp", "--script", "t.py", "-j", j], f"-j '{j}' is invalid")
        for j in ("x4", "1x", ":2", "1x2:3", "2x2x2", "0x1", "3:2x1", "-1x2", "ax2", "1x0")
    ],
    (["run", "dist.dpp"], "did you mean dist.ddp"),
    (["run", "dist.ddp"], "exactly one of --script FILE or -m MODULE"),
    (["run", "dist.ddp", "--script", "t.py", "--debug", "maybe"], "not a bool"),
    (["run", "dist.ddp", "--script", "t.py", "--cpu", "two"], "'two' is not a valid int"),
    (["run", "dist.ddp", "--script", "t.py", "-h", "gpu.smal"], "did you mean 'gpu.small'"),
    (["run", "dist.ddp", "--scirpt", "t.py"], "did you mean --script"),
    (["run", "dist.ddp", "--script"], "needs a value"),
    (["run", "-s", "nosuch", "utils.echo"], "unknown scheduler 'nosuch'"),
    (["run", "-cfg", "nonsense", "utils.echo"], "is not KEY=VALUE"),
    (["run", "--dryrun", "-cfg", "log_dri=x", "utils.echo"], "unknown run option 'log_dri'"),
    (["run", "--dryrun", "utils.echo", "--mounts", "x"], "unknown option --mounts"),
    (
        ["run", "--dryrun", "dist.ddp", "--script", "t", "--mounts", "type=nfs,src=a,dst=b"],
        "unknown type 'nfs'",
    ),
    (["run", "--dryrun", "missing.yaml"], "cannot read spec 'missing.yaml'"),
    (["run", "--dryrun", "missing.py:fn"], "does not exist"),
    (["run"], "missing COMPONENT"),
    (["run", "--frobnicate", "utils.echo"], "'--frobnicate' is not an option of xrun run"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["status", "not-a-handle"], "malformed app handle 'not-a-handle'"),
    (["log", "local_cwd://default/app/role/abc"], "replicas 'abc' must be numbers"),
    (["log", "local_cwd:/x"], "malformed"),
    (["runopts", "nosuch"], "unknown scheduler 'nosuch'"),
    (["builtins", "--print", "dist.nope"], "unknown component 'dist.nope'"),
]


@pytest.mark.parametrize("args, expected", BAD_RUNS, ids=[" ".join(a) for a, _ in BAD_RUNS])
def test_bad_input_exits_2_with_one_line(cli: Env, args: list[str], expected: str) -> None:
    r = cli.run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("xrun: error: ") and expected in lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("broken.py", "def f(:\n", "syntax error at line 1"),
        (
            "noann.py",
            "from xrun.specs import AppDef\ndef f(a) -> AppDef: ...\n",
            "parameter 'a' has no type annotation",
        ),
        (
            "badtype.py",
            "from xrun.specs import AppDef\ndef f(a: set) -> AppDef: ...\n",
            "unsupported type",
        ),
        ("nofn.py", "def g(): pass\n", "no function 'f'; functions defined: g"),
    ],
)
def test_broken_component_file_is_reported_with_its_problem(
    cli: Env, name: str, text: str, expected: str
) -> None:
    (cli.cwd / name).write_text(text)
    r = cli.run("run", "--dryrun", f"{name}:f")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1 and expected in r.stderr


def test_bad_config_file_exits_2_naming_file_section_key(cli: Env) -> None:
    (cli.cwd / ".xrunconfig").write_text("[component:dist.ddp]\ncpu = many\n")
    r = cli.run("run", "--dryrun", "dist.ddp", "--script", "t.py")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert f"{cli.cwd / '.xrunconfig'} [component:dist.ddp] cpu" in r.stderr
    (cli.cwd / ".xrunconfig").write_text("[local_cwd]\nstop_grace_s = soon\n")
    r = cli.run("run", "--dryrun", "utils.echo")
    assert r.returncode == 2 and "[local_cwd] stop_grace_s" in r.stderr


@pytest.mark.parametrize("command", ["status", "cancel", "describe", "log"])
def test_unknown_handle_exits_1_not_found(cli: Env, command: str) -> None:
    r = cli.run(command, "local_cwd://default/no-such-app-123")
    assert r.returncode == 1, r.stderr
    assert "not found" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.timeout(60)
def test_local_run_echo_then_status_log_describe_list(cli: Env) -> None:
    r = cli.run(
        "run",
        "-s",
        "local_cwd",
        "utils.echo",
        "--msg",
        "hi from ${replica_id}",
        "--num_replicas",
        "2",
    )
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    assert r.stdout == handle + "\n" and handle.startswith("local_cwd://default/echo-")
    assert "echo/0 hi from 0" in r.stderr and "echo/1 hi from 1" in r.stderr
    status = cli.run("status", handle)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout
    log = cli.run("log", f"{handle}/echo/1")  # into a pipe: prefixed even alone, as TorchX's
    assert log.returncode == 0 and log.stdout == "echo/1 hi from 1\n"
    both = cli.run("log", handle)
    assert sorted(both.stdout.splitlines()) == ["echo/0 hi from 0", "echo/1 hi from 1"]
    desc = cli.run("describe", handle)
    assert desc.returncode == 0 and "entrypoint" in desc.stdout and "SUCCEEDED" in desc.stdout
    listed = cli.run("list", "-s", "local_cwd")
    assert handle in listed.stdout
    assert cli.run("log", f"{handle}/nope").returncode == 2
    assert cli.run("log", f"{handle}/echo/5").returncode == 2


@pytest.mark.timeout(60)
def test_local_run_failure_exits_1(cli: Env) -> None:
    r = cli.run("run", "utils.sh", "echo", "bye;", "exit", "3")
    assert r.returncode == 1
    assert "sh/0 bye" in r.stderr and "FAILED" in r.stderr


@pytest.mark.timeout(60)
def test_ddp_script_args_are_quoted_end_to_end(cli: Env) -> None:
    (cli.cwd / "argv.py").write_text(
        "import json, sys\nprint('ARGV=' + json.dumps(sys.argv[1:]), flush=True)\n"
    )
    args = ["a b", "$HOME", "it's", "--lr=0.1", "*"]
    r = cli.run("run", "dist.ddp", "-j", "1x1", "--script", "argv.py", *args)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if "ARGV=" in x)
    assert json.loads(line.split("ARGV=", 1)[1]) == args


def test_dryrun_imports_nothing_heavy(cli: Env) -> None:
    """The start-up budget: yaml, docstring_parser, fsspec, torch and configparser stay out."""
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "xrun",
            "run",
            "--dryrun",
            "dist.ddp",
            "-j",
            "2x2",
            "--script",
            "t.py",
        ],
        cwd=cli.cwd,
        env={**os.environ, "HOME": str(cli.home)},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "xrun.cli" in imported
    heavy = {"yaml", "docstring_parser", "fsspec", "torch", "configparser", "docker"}
    assert not heavy & imported


def test_example_custom_component(cli: Env, repo_root: Path) -> None:
    example = f"{repo_root}/examples/my_component.py:trainer"
    r = cli.run(
        "run",
        "--dryrun",
        example,
        "--epochs",
        "2",
        "-j",
        "2x2",
        "--tags",
        "a,b",
        "--",
        "--seed",
        "3",
    )
    assert r.returncode == 0, r.stderr
    app, _ = split_dryrun(r.stdout)
    assert app.name == "trainer" and app.metadata == {"tags": "a,b"}
    assert app.roles[0].num_replicas == 2 and app.roles[0].env["OMP_NUM_THREADS"] == "1"
    assert "examples/train_ddp.py --epochs 2 --lr 0.1" in app.roles[0].args[1]
    assert app.roles[0].args[1].endswith("--seed 3")
    r = cli.run("run", example, "--help")
    assert r.returncode == 0 and "how many passes over the synthetic data" in r.stdout
    r = cli.run("run", example, "--epochs", "0")
    assert r.returncode == 2 and "--epochs 0 is invalid" in r.stderr
    # docs/cli.md's first custom-component command, run for real
    r = cli.run(
        "run", "-s", "local_cwd", f"{repo_root}/examples/my_component.py:hello", "--who", "world"
    )
    assert r.returncode == 0 and "greeter/0 hello world from replica 0 of hello-" in r.stderr


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_tty_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeRunner:
        def logs(self, handle: str, query: LogQuery) -> list[str]:
            return [f"line from {query.role}/{query.k}\n"]

    def printed(out: io.StringIO) -> str:
        targets = [LogTarget("h", "r", 0, "r/0"), LogTarget("h", "r", 1, "r/1")]
        LogPrinter(FakeRunner(), targets, out=out, follow=False).run()
        return out.getvalue()

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\033[" in printed(_Tty())
    plain = printed(io.StringIO())
    assert "\033[" not in plain and sorted(plain.splitlines()) == [
        "r/0 line from r/0",
        "r/1 line from r/1",
    ]
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\033[" not in printed(_Tty())


@pytest.mark.timeout(60)
def test_status_and_follow_from_another_process_while_running(cli: Env) -> None:
    from xrun.config import Config
    from xrun.runner import Runner

    script = "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second"
    with Runner(config=Config()) as runner:
        handle = runner.run_component("utils.sh", [f"cd {cli.cwd} && {script}"], "local_cwd")
        try:
            follower = subprocess.Popen(
                [XRUN, "log", "-f", handle],
                cwd=cli.cwd,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "HOME": str(cli.home)},
            )
            assert follower.stdout is not None
            assert follower.stdout.readline() == "sh/0 first\n"  # printed while the app runs
            status = cli.run("status", handle)
            assert status.returncode == 0 and "State: RUNNING" in status.stdout
            (cli.cwd / "go").touch()
            rest, _ = follower.communicate(timeout=30)
            assert rest == "sh/0 second\n" and follower.returncode == 0  # ended with the app
        finally:
            st = runner.status(handle)
            if st is not None and not st.is_terminal():
                runner.cancel(handle)


@pytest.mark.timeout(60)
def test_ctrl_c_on_a_local_run_cancels_the_app_and_cancel_command(cli: Env) -> None:
    import signal

    proc = subprocess.Popen(
        [XRUN, "run", "-cfg", "stop_grace_s=1", "utils.sh", "echo started; sleep 30"],
        cwd=cli.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(cli.home)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    handle = proc.stdout.readline().strip()  # printed as soon as the app is submitted
    while "started" not in proc.stderr.readline():
        pass
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err
    status = cli.run("status", handle)
    assert "State: CANCELLED" in status.stdout
    # `xrun cancel` on a finished app: says it had ended (exit 3, #26), still CANCELLED
    again = cli.run("cancel", handle)
    assert again.returncode == 3 and "had already ended CANCELLED" in again.stderr
    assert "State: CANCELLED" in cli.run("status", handle).stdout


@pytest.mark.timeout(120)
def test_ctrl_c_tests_pass_when_the_suite_starts_with_sigint_ignored() -> None:
    """The suite run from a background job (`bash scripts/stress-suite.sh &`, nohup, a CI
    runner) inherits SIGINT ignored, and so did every xrun it started: the Ctrl-C test above
    waited 30 s for an exit that never came (found by scripts/stress-suite.sh under nohup).
    conftest gives the suite's processes a terminal's disposition; this runs that test in a
    pytest started exactly so."""
    test = "tests/cli/test_cli.py::test_ctrl_c_on_a_local_run_cancels_the_app_and_cancel_command"
    r = subprocess.run(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]
        + [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", test],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.timeout(60)
def test_log_regex_and_streams(cli: Env) -> None:
    r = cli.run("run", "utils.sh", "echo out1; echo out2; echo err1 >&2")
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    assert cli.run("log", handle, "--regex", "out2").stdout == "sh/0 out2\n"
    assert cli.run("log", handle, "--streams", "stderr").stdout == "sh/0 err1\n"
    assert cli.run("log", handle, "--streams", "stdout").stdout == "sh/0 out1\nsh/0 out2\n"
    bad = cli.run("log", handle, "--regex", "(")
    assert bad.returncode == 2 and "not a valid regular expression" in bad.stderr


def test_default_scheduler_from_config(cli: Env) -> None:
    (cli.cwd / ".xrunconfig").write_text("[cli:run]\nscheduler = nosuch\n")
    r = cli.run("run", "--dryrun", "utils.echo")
    assert r.returncode == 2 and "unknown scheduler 'nosuch'" in r.stderr  # the file was used
    assert cli.run("run", "--dryrun", "-s", "local_cwd", "utils.echo").returncode == 0


@pytest.mark.timeout(60)
def test_log_into_a_closed_pipe_is_quiet(cli: Env) -> None:
    r = cli.run("run", "utils.sh", "seq 1 100000")
    handle = r.stdout.strip()
    proc = subprocess.Popen(
        [XRUN, "log", handle],
        cwd=cli.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOME": str(cli.home)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"sh/0 1\n"
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 0 and err == b""


def test_status_roles_shows_only_those_roles(cli: Env) -> None:
    """TorchX's ``status --roles ROLE[,ROLE]`` (gap N18): the other roles are left out; a role
    the app lacks is a one-line usage error naming the roles it has."""
    from xrun.config import Config
    from xrun.runner import Runner
    from xrun.specs import AppDef, AppState, Role

    app = AppDef("two", [Role("trainer", "", "echo", ["t"]), Role("reader", "", "echo", ["r"])])
    with Runner(config=Config()) as runner:
        handle = runner.run(app, "local_cwd")
        resp = runner.wait(handle, wait_interval=0.1, timeout=60)
        assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    both = cli.run("status", handle)
    assert "Role trainer:" in both.stdout and "Role reader:" in both.stdout, both.stdout
    one = cli.run("status", "--roles", "reader", handle)
    assert one.returncode == 0, one.stderr
    assert "Role reader:" in one.stdout and "trainer" not in one.stdout, one.stdout
    bad = cli.run("status", "--roles", "reader,nope", handle)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "no role 'nope'" in bad.stderr and "trainer, reader" in bad.stderr, bad.stderr


def test_top_level_log_level_sets_pythons_logging(cli: Env) -> None:
    """TorchX's ``xrun --log_level LEVEL COMMAND`` (gap N18): the root logger's level; a bad
    level is a one-line usage error."""
    import logging

    from xrun.cli import main

    root = logging.getLogger()
    before = root.level
    try:
        assert main(["--log_level", "error", "list", "-s", "local_cwd"]) == 0
        assert root.level == logging.ERROR
        assert main(["--log-level=DEBUG", "list", "-s", "local_cwd"]) == 0
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(before)
    bad = cli.run("--log_level", "loud", "list")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "'loud' is not a log level; expected one of DEBUG" in bad.stderr
    assert "--log_level LEVEL" in cli.run("--help").stdout


@pytest.mark.timeout(150)
def test_dist_ddp_workers_look_as_under_torchx(cli: Env) -> None:
    """gap N17: TorchX's `dist.ddp` gives torchrun an empty role and its CLI sets
    TORCHX_CONTEXT_NAME=cli_run, so its workers see ROLE_NAME='' and print `[1]:` before each
    line; a log grep written for one tool must work on the other. A .torchxconfig's
    [cli:run] scheduler is honoured on the way (the project's file, unchanged)."""
    (cli.cwd / ".torchxconfig").write_text("[cli:run]\nscheduler = local_cwd\n")
    (cli.cwd / "envdump.py").write_text(
        "import os\n"
        "print('ENV', repr(os.environ['ROLE_NAME']), os.environ.get('TORCHX_CONTEXT_NAME'),"
        " os.environ.get('TORCHX_RANK0_HOST'), os.environ['RANK'])\n"
    )
    p = cli.run("run", "dist.ddp", "-j", "1x2", "--script", "envdump.py", timeout=140)
    assert p.returncode == 0, p.stderr[-3000:]
    out = [ln for ln in (p.stdout + p.stderr).splitlines() if "ENV" in ln]
    for rank in (0, 1):
        assert any(ln.endswith(f"[{rank}]:ENV '' cli_run localhost {rank}") for ln in out), out
