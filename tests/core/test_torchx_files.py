"""TorchX component files run unchanged: ``xrun run path/to/file.py:fn``.

The files below are our own copies of the *shape* of TorchX's public examples (the custom
component of docs/source/custom_components.md, the dist.ddp wrappers of its scripts/ and
compute_world_size example), not TorchX's code. TorchX is not installed here: xrun stands in
for the ``torchx`` imports while such a file loads and runs, and nowhere else.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from xrun.component import call_component, get_component
from xrun.errors import UsageError
from xrun.specs import AppDef, BindMount
from xrun.torchx.compat import torchx_imports, torchx_installed

GREET = '''\
import torchx.specs as specs


def greet(user: str, image: str = "my_app:latest") -> specs.AppDef:
    """Greets a user.

    Args:
        user: the person to greet
        image: the image to run in
    """
    return specs.AppDef(
        name="hello_world",
        roles=[
            specs.Role(
                name="greeter",
                image=image,
                entrypoint="python",
                args=["-m", "my_app", "--user", user],
            )
        ],
    )
'''

MY_APP = """\
import argparse
p = argparse.ArgumentParser()
p.add_argument("--user", required=True)
print(f"Hello, {p.parse_args().user}!")
"""

TRAINER = '''\
from typing import Dict, Optional

import torchx
from torchx.components.dist import ddp as dist_ddp
from torchx.specs import AppDef


def trainer(
    *script_args: str,
    j: str = "2x2",
    max_retries: int = 0,
    env: Optional[Dict[str, str]] = None,
    image: str = torchx.IMAGE,
) -> AppDef:
    """The team's DDP job.

    Args:
        script_args: the trainer's arguments
        j: nodes x processes
        max_retries: retries
        env: more env vars
        image: the image
    """
    return dist_ddp(
        *script_args,
        m="compute_world_size",
        name="ddp-trainer",
        image=image,
        cpu=1,
        j=j,
        max_retries=max_retries,
        env={"LOGLEVEL": "INFO", **(env or {})},
    )
'''

COMPUTE_WORLD_SIZE = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([1.0])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: world size {int(t.item())}", flush=True)
dist.barrier()
os._exit(0)
"""

EVERYTHING = '''\
from __future__ import annotations

from typing import List, Optional

import torchx.specs as specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros, named_resources


def big(name: str = "exp/run", h: str = "aws_p3.2xlarge", mounts: Optional[List[str]] = None) -> specs.AppDef:
    """Uses many of TorchX's spec helpers.

    Args:
        name: EXP/RUN
        h: a named resource
        mounts: mounts
    """
    arg = StructuredNameArgument.parse_from(name=name, script="train.py")
    return specs.AppDef(
        name=arg.run_name,
        roles=[
            specs.Role(
                name="worker",
                image=specs.NONE,
                entrypoint="python",
                args=["train.py", "--id", macros.replica_id, "--job", macros.app_id],
                env={"EXP": arg.experiment_name},
                num_replicas=2,
                resource=named_resources[h],
                retry_policy=specs.RetryPolicy.REPLICA,
                mounts=specs.parse_mounts(mounts or []),
            )
        ],
    )


def late(msg: str = "hi") -> specs.AppDef:
    """Imports TorchX when called.

    Args:
        msg: the message
    """
    from torchx.components.utils import echo

    return echo(msg=msg)
'''


@pytest.fixture
def cli(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_torchx_is_not_installed_here() -> None:
    assert not torchx_installed()  # else these tests would not test the stand-ins


def test_the_stand_ins_exist_only_while_a_file_loads_and_runs(tmp_path: Path) -> None:
    comp = get_component(_write(tmp_path / "c.py", EVERYTHING) + ":late")
    assert not any(m == "torchx" or m.startswith("torchx.") for m in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        import torchx  # noqa: F401
    app = call_component(comp, ["--msg", "late import"])  # imports torchx inside the call
    assert app.roles[0].args == ["late import"] and app.roles[0].resource.cpu == 1
    assert not any(m == "torchx" or m.startswith("torchx.") for m in sys.modules)
    with torchx_imports():
        import torchx.specs

        assert torchx.specs.AppDef is AppDef
        with pytest.raises(ModuleNotFoundError, match="xrun stands in only for torchx, "):
            import torchx.pipelines  # noqa: F401
    assert "torchx" not in sys.modules


def test_torchx_helpers_behave_as_torchx_s(tmp_path: Path) -> None:
    comp = get_component(_write(tmp_path / "c.py", EVERYTHING) + ":big")
    app = call_component(comp, ["--mounts", "type=bind,src=/data,dst=/data,readonly"])
    role = app.roles[0]
    assert app.name == "run" and role.env == {"EXP": "exp"}
    assert role.image == "<NONE>" and role.args[2] == "${replica_id}"
    assert (role.resource.cpu, role.resource.gpu) == (8, 1)
    assert role.mounts == [BindMount("/data", "/data", True)]
    assert role.retry_policy.value == "REPLICA"
    assert call_component(comp, ["--name", "solo"]).roles[0].env == {"EXP": "default-experiment"}


def test_custom_component_runs_for_real_on_local_cwd(cli: Env) -> None:
    _write(cli.cwd / "my_app.py", MY_APP)
    comp = _write(cli.cwd / "my_component.py", GREET)
    r = cli.run("run", "--scheduler", "local_cwd", f"{comp}:greet", "--user", "your name")
    assert r.returncode == 0, r.stderr
    assert "greeter/0 Hello, your name!" in r.stderr
    helped = cli.run("run", f"{comp}:greet", "--help")
    assert helped.returncode == 0 and "the person to greet" in helped.stdout


@pytest.mark.timeout(240)
def test_a_dist_ddp_wrapper_runs_a_real_2x2_job(cli: Env) -> None:
    _write(cli.cwd / "compute_world_size.py", COMPUTE_WORLD_SIZE)
    comp = _write(cli.cwd / "components.py", TRAINER)
    dry = cli.run("run", "--dryrun", f"{comp}:trainer", "--max_retries", "1")
    assert dry.returncode == 0, dry.stderr
    assert 'image: "xrun-python:latest"' in dry.stdout and "name: ddp-trainer" in dry.stdout
    assert "LOGLEVEL: INFO" in dry.stdout and "--max-restarts 1" in dry.stdout
    r = cli.run("run", "-s", "local_cwd", f"{comp}:trainer", timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}: world size 4" in r.stderr


def test_a_broken_torchx_import_names_what_xrun_provides(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.py", "from torchx.pipelines.kfp import adapter\n")
    with pytest.raises(UsageError, match=r"No module named 'torchx.pipelines'.*stands in only"):
        get_component(f"{path}:f")


# A package named torchx with TorchX's AppDef/Role/Resource field names: "TorchX installed".
FAKE_TORCHX = {
    "torchx/__init__.py": "IMAGE = 'ghcr.io/pytorch/torchx:0.7.0'\n",
    "torchx/specs/__init__.py": textwrap.dedent(
        """\
        import enum
        from dataclasses import dataclass, field
        from typing import Any, Dict, List, Optional

        class RetryPolicy(str, enum.Enum):
            APPLICATION = "APPLICATION"

        @dataclass
        class Resource:
            cpu: int
            gpu: int
            memMB: int
            capabilities: Dict[str, Any] = field(default_factory=dict)
            devices: Dict[str, int] = field(default_factory=dict)

        @dataclass
        class BindMount:
            src_path: str
            dst_path: str
            read_only: bool = False

        @dataclass
        class Role:
            name: str
            image: str
            min_replicas: Optional[int] = None
            base_image: Optional[str] = None
            entrypoint: str = "<MISSING>"
            args: List[str] = field(default_factory=list)
            env: Dict[str, str] = field(default_factory=dict)
            num_replicas: int = 1
            max_retries: int = 0
            retry_policy: RetryPolicy = RetryPolicy.APPLICATION
            resource: Resource = field(default_factory=lambda: Resource(-1, -1, -1))
            port_map: Dict[str, int] = field(default_factory=dict)
            metadata: Dict[str, Any] = field(default_factory=dict)
            mounts: List[Any] = field(default_factory=list)

        @dataclass
        class AppDef:
            name: str
            roles: List[Role] = field(default_factory=list)
            metadata: Dict[str, str] = field(default_factory=dict)
        """
    ),
}

INSTALLED_USER = '''\
import torchx
import torchx.specs as specs


def job(n: int = 2) -> specs.AppDef:
    """A job.

    Args:
        n: replicas
    """
    return specs.AppDef(
        name="tx",
        roles=[
            specs.Role(
                name="w",
                image=torchx.IMAGE,
                entrypoint="echo",
                args=["hi"],
                num_replicas=n,
                max_retries=2,
                resource=specs.Resource(cpu=1, gpu=0, memMB=512),
                mounts=[specs.BindMount("/a", "/b", True)],
            )
        ],
    )
'''


def test_with_torchx_installed_its_appdef_is_converted(cli: Env, tmp_path: Path) -> None:
    site = tmp_path / "site"
    for rel, text in FAKE_TORCHX.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    comp = _write(cli.cwd / "job.py", INSTALLED_USER)
    r = subprocess.run(
        [sys.executable, "-m", "xrun", "run", "--dryrun", "-s", "local_cwd", f"{comp}:job"],
        cwd=cli.cwd,
        capture_output=True,
        text=True,
        env={**cli.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert 'image: "ghcr.io/pytorch/torchx:0.7.0"' in r.stdout  # the real (fake) TorchX's
    assert "max_retries: 2" in r.stdout and "memMB: 512" in r.stdout
    assert "src_path: /a" in r.stdout and "read_only: true" in r.stdout
    assert r.stdout.count("env echo hi") == 0 and "echo hi" in r.stdout
