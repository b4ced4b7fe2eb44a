"""The builtin components (dist.ddp, dist.spmd, utils.*) and the named resources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from xrun.components import DEFAULT_IMAGE, dist, utils
from xrun.errors import UsageError
from xrun.specs import AppDef, BindMount, Resource, VolumeMount, macros
from xrun.specs.named_resources import get_named_resource, names

RUNTIME_PREFIX = "exec python3 -m xrun.runtime"


def cmd_of(app: AppDef) -> str:
    role = app.roles[0]
    assert role.entrypoint == "sh" and role.args[0] == "-c" and len(role.args) == 2
    return role.args[1]


@pytest.mark.parametrize(
    "j, nnodes, nproc, replicas, min_replicas",
    [
        ("1x2", "1:1", 2, 1, 1),
        ("2x4", "2:2", 4, 2, 2),
        ("1:3x2", "1:3", 2, 3, 1),
        ("4", "1:1", 4, 1, 1),
        ("0:1x4", "1:1", 4, 1, 0),
    ],
)
def test_ddp_sizes(j: str, nnodes: str, nproc: int, replicas: int, min_replicas: int) -> None:
    app = dist.ddp(script="train.py", j=j)
    role = app.roles[0]
    assert (role.num_replicas, role.min_replicas) == (replicas, min_replicas)
    cmd = cmd_of(app)
    assert cmd.startswith(RUNTIME_PREFIX + " ")
    assert f"--nnodes {nnodes} --nproc-per-node {nproc} " in cmd
    assert "--rdzv-backend c10d" in cmd and "--rdzv-id ${app_id}" in cmd
    assert "--max-restarts 0 --tee 3 --role '' train.py" in cmd


def test_single_node_uses_a_free_local_port_and_multi_node_the_rank0_env_var() -> None:
    assert "--rdzv-endpoint localhost:0 " in cmd_of(dist.ddp(script="t.py", j="1x2"))
    multi = dist.ddp(script="t.py", j="2x2", rdzv_port=1234)
    assert "--rdzv-endpoint ${${rank0_env}}:1234 " in cmd_of(multi)
    assert multi.roles[0].port_map == {"c10d": 1234}
    # The scheduler's macro substitution gives the env var's name, expanded by the shell.
    role = macros.Values(img_root="", app_id="a-1", replica_id="0", rank0_env="MY_HOST").apply(
        multi.roles[0]
    )
    assert "--rdzv-endpoint ${MY_HOST}:1234 --rdzv-id a-1 " in role.args[1]


def _fake_python3(tmp_path: Path) -> dict[str, str]:
    """A `python3` on PATH that prints its argv as JSON: runs the real shell command line."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "XRUN_RANK0_HOST": "node0"}


def test_script_args_survive_the_shell_exactly(tmp_path: Path) -> None:
    tricky = ["a b", "$HOME", "it's", '"q"', "$$", "back\\slash", "*", "", "--lr=0.1", "${app_id}"]
    app = dist.ddp(*tricky, script="my script.py", j="2x1")
    role = macros.Values(img_root="", app_id="app-7", replica_id="0", rank0_env="XRUN_RANK0_HOST")
    sub = role.apply(app.roles[0])
    out = subprocess.run(
        [sub.entrypoint, *sub.args],
        env=_fake_python3(tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    argv = json.loads(out.stdout)
    assert argv[:3] == ["-m", "xrun.runtime", "--nnodes"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "node0:29500"
    assert argv[argv.index("--rdzv-id") + 1] == "app-7"
    i = argv.index("my script.py")
    # Macros are still substituted in script args (${app_id}); everything else is literal.
    assert argv[i + 1 :] == [*tricky[:-1], "app-7"]


def test_module_instead_of_script() -> None:
    app = dist.ddp("--x", "1", m="pkg.train", j="1x1")
    assert cmd_of(app).endswith("--tee 3 --role '' -m pkg.train --x 1")
    assert app.name == "train" and app.roles[0].name == "train"


@pytest.mark.parametrize("kw", [{}, {"script": "a.py", "m": "b"}])
def test_exactly_one_of_script_or_module(kw: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="exactly one of --script FILE or -m MODULE"):
        dist.ddp(**kw)


@pytest.mark.parametrize(
    "name, experiment, run",
    [  # TorchX's --name: EXPERIMENT/RUN; the role is always named after the script
        ("/", "default-experiment", "train_ddp"),
        ("exp/", "exp", "train_ddp"),
        ("/r", "default-experiment", "r"),
        ("exp/r", "exp", "r"),
        ("r", "default-experiment", "r"),
        ("exp/r/x", "exp", "r/x"),
    ],
)
def test_name_derivation(name: str, experiment: str, run: str) -> None:
    app = dist.ddp(script="examples/train_ddp.py", name=name)
    assert (app.name, app.roles[0].name) == (run, "train_ddp")
    assert app.roles[0].env["TORCHX_TRACKING_EXPERIMENT_NAME"] == experiment


def test_odd_script_names_still_make_valid_role_names() -> None:
    app = dist.ddp(script="dir/_my script!.py")
    app.validate()
    assert app.roles[0].name == "my-script-"


def test_resources_named_resource_overrides() -> None:
    assert dist.ddp(script="t.py").roles[0].resource == Resource(cpu=2, gpu=0, memMB=1024)
    assert dist.ddp(script="t.py", cpu=3, gpu=1, memMB=5).roles[0].resource == Resource(3, 1, 5)
    got = dist.ddp(script="t.py", h="gpu.medium", cpu=99).roles[0].resource
    assert got == get_named_resource("gpu.medium") and got.gpu == 2


def test_env_debug_retries_conf_tee_image_mounts() -> None:
    app = dist.ddp(
        script="t.py",
        env={"A": "1", "NCCL_DEBUG": "WARN"},
        debug=True,
        max_retries=3,
        rdzv_conf="join_timeout=600,last_call_timeout=30",
        tee=1,
        mounts=["type=bind,src=/a,dst=/b,readonly", "type=volume,src=v,dst=/c"],
    )
    role = app.roles[0]
    assert role.env["A"] == "1" and role.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert role.env["NCCL_DEBUG"] == "WARN"  # the user's env wins over debug's
    assert role.max_retries == 3 and role.image == DEFAULT_IMAGE
    cmd = cmd_of(app)
    assert (
        "--max-restarts 3 --tee 1 --role '' --rdzv-conf join_timeout=600,last_call_timeout=30 t.py"
        in cmd
    )
    assert role.mounts == [BindMount("/a", "/b", True), VolumeMount("v", "/c", False)]
    assert "TORCH_DISTRIBUTED_DEBUG" not in dist.ddp(script="t.py").roles[0].env


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({"rdzv_backend": "etcd"}, "--rdzv_backend etcd needs --rdzv_endpoint ETCD_HOST:PORT"),
        ({"rdzv_backend": "zk"}, "--rdzv_backend 'zk' is not supported; use one of c10d"),
        ({"rdzv_endpoint": "e:2379"}, "--rdzv_endpoint 'e:2379' is for --rdzv_backend etcd"),
        ({"rdzv_backend": "etcd", "rdzv_endpoint": "e"}, "--rdzv_endpoint 'e' is invalid"),
        ({"rdzv_backend": "etcd", "rdzv_endpoint": "e:1;x"}, "expected etcd's HOST:PORT"),
        ({"rdzv_backend": "etcd", "rdzv_endpoint": "e:70000"}, "'e:70000' is invalid"),
        ({"tee": 4}, "--tee 4 is invalid"),
        ({"rdzv_port": 0}, "--rdzv_port 0 is invalid"),
        ({"max_retries": -1}, "--max_retries -1"),
        ({"j": "2x2x2"}, "-j '2x2x2' is invalid"),
        ({"h": "gpu.smal"}, "did you mean 'gpu.small'"),
        ({"mounts": ["type=bind,src=/a"]}, "dst="),
    ],
)
def test_ddp_bad_arguments(kw: dict[str, Any], expected: str) -> None:
    with pytest.raises(UsageError, match=expected.replace("(", r"\(")):
        dist.ddp(script="t.py", **kw)


def test_etcd_meets_at_the_users_etcd_with_spares_too() -> None:
    """--rdzv_backend etcd: every replica's agent meets at etcd's endpoint (no replica is the
    rendezvous's host, so with --spares any node may be lost: docs/runtime.md)."""
    app = dist.ddp(
        script="t.py", j="2x1", spares=1, rdzv_backend="etcd", rdzv_endpoint="etcd.x:2379"
    )
    cmd = app.roles[0].args[1]
    assert "--rdzv-backend etcd --rdzv-endpoint etcd.x:2379 " in cmd and "--spares 1 " in cmd
    one = dist.ddp(script="t.py", j="1x2", rdzv_backend="etcd-v2", rdzv_endpoint="10.0.0.5:2379")
    assert "--rdzv-backend etcd-v2 --rdzv-endpoint 10.0.0.5:2379 " in one.roles[0].args[1]


def test_spmd_infers_nproc_from_the_named_resource() -> None:
    assert "--nproc-per-node 1 " in cmd_of(dist.spmd(script="t.py"))
    app = dist.spmd(script="t.py", h="gpu.xlarge", j="1:4")
    assert "--nnodes 1:4 --nproc-per-node 8 " in cmd_of(app)
    assert app.roles[0].num_replicas == 4 and app.roles[0].resource.gpu == 8
    assert "--nproc-per-node 1 " in cmd_of(dist.spmd(script="t.py", h="cpu.small"))
    with pytest.raises(UsageError, match="expected \\[MIN:\\]NNODES"):
        dist.spmd(script="t.py", j="2y4")


def test_utils_components() -> None:
    echo = utils.echo(msg="hi ${replica_id}", num_replicas=2).roles[0]
    assert (echo.entrypoint, echo.args, echo.num_replicas) == ("echo", ["hi ${replica_id}"], 2)
    sh = utils.sh("echo", "a", "|", "wc", h="cpu.small").roles[0]
    assert sh.args == ["-c", "echo a | wc"] and sh.resource == get_named_resource("cpu.small")
    py = utils.python("x", c="print(1)").roles[0]
    assert (py.entrypoint, py.args) == ("python3", ["-c", "print(1)", "x"])
    assert utils.python(script="s.py").roles[0].args == ["s.py"]
    assert utils.python(m="mod").roles[0].args == ["-m", "mod"]
    with pytest.raises(UsageError, match="exactly one of -m MODULE, -c CODE or --script FILE"):
        utils.python(m="a", c="b")
    b = utils.binary("-l", "a b", entrypoint="ls").roles[0]
    assert (b.entrypoint, b.args) == ("ls", ["-l", "a b"])
    assert utils.touch("f").roles[0].args == ["f"]
    cp = utils.copy("memory://a", "/tmp/b").roles[0]
    assert cp.args == ["-m", "xrun.components.utils", "copy", "memory://a", "/tmp/b"]
    with pytest.raises(UsageError, match="no command given"):
        utils.sh()
    utils.echo().validate()
    utils.touch("x").validate()


def test_utils_copy_worker_really_copies(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(os.urandom(3 << 20))  # several chunks
    role = utils.copy(str(src), f"file://{dst}").roles[0]
    subprocess.run([sys.executable, *role.args], check=True, capture_output=True)
    assert dst.read_bytes() == src.read_bytes()


def test_named_resources() -> None:
    assert get_named_resource("cpu.small") == Resource(cpu=1, gpu=0, memMB=1024)
    assert [get_named_resource(f"gpu.{s}").gpu for s in ("small", "medium", "large", "xlarge")] == [
        1,
        2,
        4,
        8,
    ]
    assert {"cpu.small", "cpu.medium", "cpu.large", "gpu.small", "gpu.xlarge"} <= set(names())
    a = get_named_resource("gpu.small")
    a.cpu = 1000
    assert get_named_resource("gpu.small").cpu != 1000  # a fresh copy each time
    with pytest.raises(UsageError, match=r"unknown named resource 'gpu.smal' \(did you mean"):
        get_named_resource("gpu.smal")


def test_named_resource_plugins_add_but_never_replace(tmp_path: Path) -> None:
    (tmp_path / "myres.py").write_text(
        "from xrun.specs import Resource\n"
        "def big(): return Resource(cpu=96, gpu=8, memMB=1)\n"
        "def fake_small(): return Resource(cpu=0, gpu=0, memMB=0)\n"
        "def broken(): raise RuntimeError('boom')\n"
    )
    info = tmp_path / "myres-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myres\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[xrun.named_resources]\nbig.8 = myres:big\ncpu.small = myres:fake_small\n"
        "broken = myres:broken\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert get_named_resource("big.8") == Resource(cpu=96, gpu=8, memMB=1)
        assert get_named_resource("cpu.small").cpu == 1
        assert "big.8" in names()
        with pytest.raises(UsageError, match="plugin 'broken' failed to load: boom"):
            get_named_resource("broken")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("myres", None)


def test_stall_timeout_reaches_the_agent_and_is_checked() -> None:
    """dist.ddp/dist.spmd --stall_timeout N is the agent's --stall-timeout N; 0 (default): off."""
    assert "--stall-timeout 20 " in dist.ddp(script="t.py", stall_timeout=20).roles[0].args[1]
    assert (
        "--stall-timeout 7 "
        in dist.spmd(script="t.py", h="cpu.small", stall_timeout=7).roles[0].args[1]
    )
    assert "--stall-timeout" not in dist.ddp(script="t.py").roles[0].args[1]
    with pytest.raises(UsageError, match=r"--stall_timeout -1 is invalid; expected seconds from 0"):
        dist.ddp(script="t.py", stall_timeout=-1)


def test_stall_silent_timeout_reaches_the_agent_and_is_checked() -> None:
    """dist.ddp/dist.spmd --stall_silent_timeout N is the agent's --stall-silent-timeout N (the
    silent limit, default max(10 x stall_timeout, 600 s)); without --stall_timeout the
    watchdog is off, so the limit alone is refused rather than ignored."""
    args = dist.ddp(script="t.py", stall_timeout=5, stall_silent_timeout=90).roles[0].args[1]
    assert "--stall-timeout 5 --stall-silent-timeout 90 " in args
    spmd = dist.spmd(script="t.py", h="cpu.small", stall_timeout=7, stall_silent_timeout=70)
    assert "--stall-silent-timeout 70 " in spmd.roles[0].args[1]
    assert "--stall-silent-timeout" not in dist.ddp(script="t.py", stall_timeout=5).roles[0].args[1]
    with pytest.raises(UsageError, match=r"--stall_silent_timeout -3 is invalid; expected sec"):
        dist.ddp(script="t.py", stall_timeout=5, stall_silent_timeout=-3)
    with pytest.raises(UsageError, match=r"--stall_silent_timeout 90 needs --stall_timeout"):
        dist.ddp(script="t.py", stall_silent_timeout=90)


@pytest.mark.parametrize("value", ["abc", "2.5", "-1", "1e9"])
def test_stall_silent_timeout_garbage_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    p = subprocess.run(
        [sys.executable, "-m", "xrun", "run", "--dryrun", "-s", "local_cwd", "dist.ddp"]
        + ["--stall_timeout", "5", "--stall_silent_timeout", value, "--script", "t.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.splitlines()) == 1, p.stderr
    assert (
        p.stderr.startswith("xrun: error: dist.ddp: --stall_silent_timeout") and value in p.stderr
    )


def test_recover_reaches_the_agent_and_is_checked() -> None:
    """dist.ddp --recover warm is the agent's --recover warm; off (default): no flag, as before."""
    assert "--recover warm " in dist.ddp(script="t.py", recover="warm").roles[0].args[1]
    assert "--recover" not in dist.ddp(script="t.py").roles[0].args[1]
    with pytest.raises(UsageError, match=r"--recover 'hot' is invalid; expected off or warm"):
        dist.ddp(script="t.py", recover="hot")


def test_spares_reach_the_agent_as_extra_replicas() -> None:
    """dist.ddp --spares S: S more replicas, each agent told --spares S (it parks when the
    NNODES seats are taken); c10d only; none by default."""
    role = dist.ddp(script="t.py", j="2x1", spares=1).roles[0]
    assert (role.num_replicas, role.min_replicas) == (3, 2)
    assert "--nnodes 2:2 " in role.args[1] and "--spares 1 " in role.args[1]
    one = dist.ddp(script="t.py", j="1x1", spares=1).roles[0]  # 1 node + a spare: a shared store
    assert one.num_replicas == 2 and "localhost:0" not in one.args[1]
    assert "--spares" not in dist.ddp(script="t.py", j="2x1").roles[0].args[1]
    with pytest.raises(UsageError, match=r"--spares needs --rdzv_backend c10d or etcd \(got 'st"):
        dist.ddp(script="t.py", j="2x1", spares=1, rdzv_backend="static")
    with pytest.raises(UsageError, match=r"--spares -1 is invalid"):
        dist.ddp(script="t.py", spares=-1)
