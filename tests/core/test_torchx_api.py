"""TorchX 0.7.0's behaviours that code ported from TorchX relies on: the handle API and the
named resources.

The expected values come from TorchX 0.7.0's sources (torchx/specs/builders.py, api.py,
named_resources_aws.py).
"""

from __future__ import annotations

import pytest

from xrun.errors import UsageError
from xrun.named_resources import get_named_resource, names
from xrun.specs import ParsedAppHandle, make_app_handle, parse_app_handle


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
