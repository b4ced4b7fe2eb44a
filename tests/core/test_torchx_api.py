"""TorchX 0.7.0's behaviours that code ported from TorchX relies on: the handle API, the
named resources, component option parsing.

The expected values come from TorchX 0.7.0's sources (torchx/specs/builders.py, api.py,
named_resources_aws.py, util/types.py, cli/cmd_run.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.test_component import COMP, call
from tests.helpers.cli import Env
from xrun.component import analyze, call_component
from xrun.errors import UsageError
from xrun.named_resources import get_named_resource, names
from xrun.specs import AppDef, ParsedAppHandle, make_app_handle, parse_app_handle


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
