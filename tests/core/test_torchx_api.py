"""TorchX 0.7.0's behaviours that code and configs ported from TorchX rely on: the handle API,
named resources, component option parsing, run options' spellings, the job's env vars,
``[cli:run] component``, ``xrun configure``, ``xrun log --tail``.

The expected values come from TorchX 0.7.0's sources (torchx/specs/builders.py, api.py,
named_resources_aws.py, util/types.py, runner/api.py, cli/cmd_run.py); see also the recorded
differential facts in tests/fixtures/torchx/.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

from tests.core.test_component import COMP, call
from tests.helpers.cli import Env
from xrun.component import analyze, call_component
from xrun.config import Config, load
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.api import get_scheduler
from xrun.schedulers.options import resolve_run_options
from xrun.specs import AppDef, ParsedAppHandle, Role, make_app_handle, parse_app_handle
from xrun.specs.named_resources import get_named_resource, names


@pytest.fixture
def cli(tmp_path: Path) -> Env:
    return Env(tmp_path)


# --------------------------------------------------------------------------- handles
def test_make_app_handle_takes_torchx_argument_order() -> None:
    # TorchX: make_app_handle(scheduler_backend, session_name, app_id)
    assert make_app_handle("slurm", "me", "1234") == "slurm://me/1234"


def test_parse_app_handle_unpacks_like_torchx() -> None:
    scheduler, session, app_id = parse_app_handle("local_cwd://default/ddp-x1")
    assert (scheduler, session, app_id) == ("local_cwd", "default", "ddp-x1")
    parsed = parse_app_handle("slurm:///42")
    assert isinstance(parsed, ParsedAppHandle) and isinstance(parsed, tuple)
    assert parsed.scheduler_backend == "slurm" and parsed.session_name == ""
    assert parsed.app_id == "42"
    with pytest.raises(UsageError, match="malformed app handle"):
        parse_app_handle("nope")


# --------------------------------------------------------------------------- named resources
def test_aws_named_resources_are_torchx_s() -> None:
    gib = int(1024 * 0.96)  # TorchX's MEM_TAX
    p4d = get_named_resource("aws_p4d.24xlarge")
    assert (p4d.cpu, p4d.gpu, p4d.memMB) == (96, 8, 1152 * gib)
    assert p4d.capabilities == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    assert p4d.devices == {"vpc.amazonaws.com/efa": 4}
    trn = get_named_resource("aws_trn1.32xlarge")
    assert (trn.cpu, trn.gpu, trn.memMB) == (128, 0, 512 * gib)
    assert trn.devices == {"vpc.amazonaws.com/efa": 8, "aws.amazon.com/neurondevice": 16}
    g5 = get_named_resource("aws_g5.xlarge")
    assert (g5.cpu, g5.gpu, g5.memMB, g5.devices) == (4, 1, 16 * gib, {})
    aws = [n for n in names() if n.startswith("aws_")]
    assert len(aws) == 26 and "aws_p5.48xlarge" in aws and "aws_t3.medium" in aws
    get_named_resource("aws_p3.2xlarge").capabilities["x"] = 1  # a fresh copy each time
    assert "x" not in get_named_resource("aws_p3.2xlarge").capabilities
    with pytest.raises(UsageError, match="did you mean 'aws_p4d.24xlarge'"):
        get_named_resource("aws_p4d.24xlarg")


# --------------------------------------------------------------------------- component options
def test_dict_option_splits_on_semicolons_as_torchx_does() -> None:
    assert call("--name", "n", "--env", "A=1;B=2")["env"] == "{'A': '1', 'B': '2'}"
    assert call("--name", "n", "--env", "A=1;B=2,C=3")["env"] == "{'A': '1', 'B': '2', 'C': '3'}"
    # a value that contains a delimiter keeps it (TorchX: FOO=v1;v2,BAR=v3)
    assert call("--name", "n", "--env", "FOO=v1;v2,BAR=v3")["env"] == (
        "{'FOO': 'v1;v2', 'BAR': 'v3'}"
    )
    assert call("--name", "n", "--env", "GPUS=0,1")["env"] == "{'GPUS': '0,1'}"


def test_a_repeated_option_is_refused_unless_it_is_a_list() -> None:
    with pytest.raises(UsageError, match=r"--count is given twice \('1', then '2'\)"):
        call("--name", "n", "--count", "1", "--count", "2")
    with pytest.raises(UsageError, match="--some-name is given twice"):
        call("--name", "n", "--some_name", "a", "--some-name", "b")
    assert call("--name", "n", "--tags", "a,b", "--tags", "c")["tags"] == "['a', 'b', 'c']"
    # the arguments of *args may repeat anything
    assert call("--name", "n", "--", "--count", "--count")["rest"] == "('--count', '--count')"


def test_repeated_option_through_the_cli_exits_2(cli: Env) -> None:
    r = cli.run("run", "--dryrun", "utils.echo", "--msg", "a", "--msg", "b")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--msg is given twice ('a', then 'b')" in r.stderr
    assert cli.run("run", "--dryrun", "utils.echo", "--msg", "a").returncode == 0


def test_a_component_s_value_error_is_a_usage_error() -> None:
    def torchx_style(x: int = 1) -> AppDef:
        raise ValueError("exactly one of --script and -m must be specified")

    with pytest.raises(UsageError, match="t.c: exactly one of --script and -m"):
        call_component(analyze("t.c", torchx_style), [])
    assert COMP.name == "test.typed"


# --------------------------------------------------------------------------- run options
def test_slurm_accepts_torchx_spellings_of_mail_options(tmp_path: Path) -> None:
    sched = get_scheduler("slurm", "t")
    opts = sched.run_opts()
    cfg = opts.resolve({"mail-user": "me@x.org", "mail-type": "END"}, "slurm")
    assert cfg.mail_user == "me@x.org" and cfg.mail_type == "END"
    with pytest.raises(UsageError, match="'mail_user' is given twice"):
        opts.resolve({"mail-user": "a", "mail_user": "b"}, "slurm")
    (tmp_path / ".xrunconfig").write_text("[slurm]\nmail-user = cfg@x.org\n")
    config = load(cwd=tmp_path, home=tmp_path / "nohome")
    assert resolve_run_options(opts, config.scheduler_defaults("slurm"), "slurm") == {
        "mail_user": "cfg@x.org"
    }
    with Runner(config=config) as runner:
        # the command line wins over the file, whichever spelling each uses
        assert runner.run_cfg("slurm", {"mail-user": "cli@x.org"})["mail_user"] == "cli@x.org"
        info = runner.dryrun(_echo(), "slurm", {"mail-type": "FAIL"})
    script = str(info)
    assert "#SBATCH --mail-user=cfg@x.org\n" in script and "#SBATCH --mail-type=FAIL\n" in script
    assert "also mail-user" in str(opts)


def test_slurm_comment_may_contain_spaces() -> None:
    info = get_scheduler("slurm", "t").submit_dryrun(_echo(), {"comment": "my run, take 2"})
    assert info.request.sbatch_argv[-1] == "--comment=xrun:echo;echo=1,my run, take 2"
    assert "#SBATCH --comment" not in info.request.script


# --------------------------------------------------------------------------- the job's env
def _echo() -> AppDef:
    return AppDef("echo", [Role("echo", "", "echo", ["hi"])])


def test_every_replica_gets_torchx_job_id_and_the_yaml_stays_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID", "TORCHX_TRACKER_MLFLOW_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    app = _echo()
    with Runner("sess", config=Config()) as runner:
        req = runner.dryrun(app, "local_cwd").request
    env = req.replicas[0].env
    assert env["TORCHX_JOB_ID"] == f"local_cwd://sess/{req.app_id}"  # ${app_id} filled in
    assert "TORCHX_PARENT_RUN_ID" not in env and "TORCHX_TRACKERS" not in env
    assert app.roles[0].env == {}  # the AppDef printed by --dryrun runs again anywhere


def test_tracking_variables_from_config_env_and_parent_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID", "TORCHX_TRACKER_FSSPEC_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / ".xrunconfig").write_text(
        "[torchx:tracker]\nfsspec =\nmlflow =\n[tracker:fsspec]\nconfig = /tmp/fs.conf\n"
    )
    config = load(cwd=tmp_path, home=tmp_path / "nohome")
    with Runner(config=config) as runner:
        env = runner.dryrun(_echo(), "local_cwd", parent_run_id="p1").request.replicas[0].env
        assert env["TORCHX_TRACKERS"] == "fsspec,mlflow"
        assert env["TORCHX_TRACKER_FSSPEC_CONFIG"] == "/tmp/fs.conf"
        assert "TORCHX_TRACKER_MLFLOW_CONFIG" not in env
        assert env["TORCHX_PARENT_RUN_ID"] == "p1"
        # the submitter's environment wins, as in TorchX
        monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
        monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", "uri")
        monkeypatch.setenv("TORCHX_PARENT_RUN_ID", "p2")
        env = runner.dryrun(_echo(), "local_cwd", parent_run_id="p1").request.replicas[0].env
    assert env["TORCHX_TRACKERS"] == "mlflow" and env["TORCHX_TRACKER_MLFLOW_CONFIG"] == "uri"
    assert env["TORCHX_PARENT_RUN_ID"] == "p2" and "TORCHX_TRACKER_FSSPEC_CONFIG" not in env


def test_parent_run_id_from_the_cli(cli: Env) -> None:
    r = cli.run("run", "--dryrun", "--parent_run_id", "exp-9", "utils.echo")
    assert r.returncode == 0, r.stderr
    assert "TORCHX_PARENT_RUN_ID=exp-9" in r.stdout and "TORCHX_JOB_ID=local_cwd://" in r.stdout


# --------------------------------------------------------------------------- [cli:run] component
def test_default_component_from_config(cli: Env) -> None:
    r = cli.run("run", "--dryrun", "--msg", "x")
    assert r.returncode == 2 and "'--msg' is not an option of xrun run" in r.stderr
    assert "[cli:run] component" in r.stderr
    (cli.cwd / ".xrunconfig").write_text("[cli:run]\ncomponent = utils.echo\n")
    for args in (["--msg", "from-config"], ["--", "--msg", "from-config"]):
        r = cli.run("run", "--dryrun", "-s", "local_cwd", *args)
        assert r.returncode == 0, r.stderr
        assert "echo from-config" in r.stdout
    r = cli.run("run", "--dryrun", "utils.sh", "echo", "named")  # a named one wins
    assert r.returncode == 0 and "echo named" in r.stdout


# --------------------------------------------------------------------------- xrun configure
def test_configure_writes_every_run_option_commented(cli: Env) -> None:
    r = cli.run("configure")
    assert r.returncode == 0, r.stderr
    path = cli.cwd / ".xrunconfig"
    text = path.read_text()
    for sched in ("local_cwd", "slurm", "docker"):
        for opt in get_scheduler(sched).run_opts():
            assert f"\n# {opt.name} =" in text, (sched, opt.name)
    assert "# signal = USR2@90\n" in text and "# stop_grace_s = 10.0\n" in text
    assert cli.run("run", "--dryrun", "utils.echo").returncode == 0  # a valid, inert file
    # uncommented as written, every default is accepted as it stands
    setting = re.compile(r"^# [A-Za-z_][\w-]* =")
    lines = [ln[2:] if setting.match(ln) else ln for ln in text.splitlines()]
    path.write_text("\n".join(ln for ln in lines if not ln.startswith("scheduler =")) + "\n")
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    config = load(cwd=cli.cwd, home=cli.home)
    for sched in ("local_cwd", "slurm", "docker"):
        opts = get_scheduler(sched).run_opts()
        resolve_run_options(opts, config.scheduler_defaults(sched), sched)
        assert set(parser[sched]) == {o.name for o in opts}
    # an existing file is left alone unless --force
    path.write_text("[local_cwd]\nlog_dir = /mine\n")
    again = cli.run("configure", "-s", "local_cwd")
    assert again.returncode == 2 and "exists already; pass --force" in again.stderr
    assert path.read_text() == "[local_cwd]\nlog_dir = /mine\n"
    assert cli.run("configure", "-s", "local_cwd", "--force").returncode == 0
    assert "[slurm]" not in path.read_text() and "# log_dir =" in path.read_text()
    printed = cli.run("configure", "--print", "-s", "slurm")
    assert printed.returncode == 0 and printed.stdout.startswith("# .xrunconfig")
    assert "[local_cwd]" not in printed.stdout
    bad = cli.run("configure", "-s", "nosuch", "--print")
    assert bad.returncode == 2 and "unknown scheduler 'nosuch'" in bad.stderr


# --------------------------------------------------------------------------- xrun log --tail
@pytest.mark.timeout(60)
def test_log_tail_is_follow_and_piped_lines_are_prefixed(cli: Env) -> None:
    r = cli.run("run", "utils.echo", "--msg", "one")
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    for flag in ("--tail", "-t", "-f"):
        out = cli.run("log", flag, handle)
        assert out.returncode == 0 and out.stdout == "echo/0 one\n", (flag, out.stderr)
