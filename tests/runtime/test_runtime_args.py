"""The agent's torchrun-compatible command line: flags -> LaunchConfig + worker command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xrun.errors import UsageError
from xrun.runtime.__main__ import main
from xrun.runtime.args import parse, parse_nproc, parse_rdzv_conf
from xrun.runtime.config import LaunchConfig, WorkerGroup, log_line_prefix, worker_env
from xrun.runtime.rendezvous import Endpoint
from xrun.runtime.workers.streams import Std


def test_dash_and_underscore_forms_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    dash = parse(
        [
            "--nproc-per-node",
            "3",
            "--max-restarts",
            "2",
            "--rdzv-conf",
            "join_timeout=5",
            "--log-dir",
            "/tmp/x",
            "s.py",
            "a",
        ]
    )
    under = parse(
        [
            "--nproc_per_node",
            "3",
            "--max_restarts",
            "2",
            "--rdzv_conf",
            "join_timeout=5",
            "--log_dir",
            "/tmp/x",
            "s.py",
            "a",
        ]
    )
    assert dash == under
    cfg = dash[0]
    assert (cfg.nproc_per_node, cfg.max_restarts, dict(cfg.rdzv_conf)) == (
        3,
        2,
        {"join_timeout": "5"},
    )


def test_pet_env_vars_give_defaults_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "4")
    monkeypatch.setenv("PET_STANDALONE", "1")
    cfg, _, _ = parse(["s.py"])
    assert (cfg.nproc_per_node, cfg.max_restarts, cfg.rdzv_backend) == (3, 4, "c10d")
    cfg, _, _ = parse(["--nproc-per-node", "2", "s.py"])
    assert cfg.nproc_per_node == 2


def test_torchrun_2_13_flags_parse_with_torchruns_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _, _ = parse(
        [
            "--nproc-per-node=2",
            "--duplicate-stdout-filters=loss,,acc,step",
            "--duplicate_stderr_filters",
            "Error",
            "--event-log-handler=console",
            "--logs-specs=default",
            "s.py",
        ]
    )
    assert cfg.duplicate_stdout_filters == ["loss,acc", "step"]  # ",," is a literal comma
    assert cfg.duplicate_stderr_filters == ["Error"]
    assert cfg.event_log_handler == "console" and cfg.logs_specs is None
    assert not cfg.virtual_local_rank and cfg.numa_options is None
    monkeypatch.setenv("PET_VIRTUAL_LOCAL_RANK", "1")  # torchrun reads it from the env too
    assert parse(["s.py"])[0].virtual_local_rank


def test_one_node_without_endpoint_is_standalone() -> None:
    cfg, entry, args = parse(["--nproc-per-node", "4", "train.py", "--lr", "${local_rank}"])
    # standalone: the agent picks a random run id (checked in test_env_vs_torchrun.py and
    # agent/test_launch.py)
    assert cfg.rdzv_backend == "c10d" and cfg.standalone and cfg.run_id == ""
    assert entry == os.environ.get("PYTHON_EXEC", sys.executable)
    assert args == ("-u", "train.py", "--lr", "${local_rank}")


def test_multi_node_c10d_and_static() -> None:
    cfg, _, _ = parse(
        [
            "--nnodes",
            "1:3",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "[::1]:29411",
            "--rdzv-id",
            "job",
            "s.py",
        ]
    )
    assert (cfg.min_nodes, cfg.max_nodes, cfg.rdzv_endpoint, cfg.run_id) == (
        1,
        3,
        "[::1]:29411",
        "job",
    )
    cfg, _, _ = parse(
        [
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "1234",
            "s.py",
        ]
    )
    assert (cfg.rdzv_backend, cfg.rdzv_endpoint, cfg.node_rank) == ("static", "10.0.0.1:1234", 1)
    cfg, _, _ = parse(["--nnodes", "2", "--master-addr", "::1", "s.py"])
    assert cfg.rdzv_endpoint == "[::1]:29500"
    cfg, _, _ = parse(["--nnodes", "2", "--master-addr", "[::1]", "s.py"])
    assert cfg.rdzv_endpoint == "[::1]:29500"


def test_rdzv_endpoint_has_one_parser_the_rendezvous_one() -> None:
    # The command line checks --rdzv-endpoint with the grammar the rendezvous reads it with.
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-id", "j", "--rdzv-endpoint"]
    cfg, _, _ = parse([*args, "::1", "s.py"])
    assert cfg.endpoint == Endpoint("::1", 29400)  # parsed once, carried as the value
    with pytest.raises(UsageError, match=r"--rdzv-endpoint: .*\[IPV6\]:PORT"):
        parse([*args, "::1:29400", "s.py"])


def test_module_no_python_run_path_and_python_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHON_EXEC", "/opt/py/bin/python3")
    assert parse(["-m", "pkg.train", "x"])[1:] == (
        "/opt/py/bin/python3",
        ("-u", "-m", "pkg.train", "x"),
    )
    assert parse(["--no-python", "/bin/echo", "hi"])[1:] == ("/bin/echo", ("hi",))
    cfg, entry, args = parse(["--run-path", "rel/s.py", "x"])
    assert callable(entry) and args == ("rel/s.py", "x")  # as typed, as torchrun


def test_redirects_tee_and_filter() -> None:
    cfg, _, _ = parse(
        ["--nproc-per-node", "2", "-r", "3", "-t", "0:1,1:2", "--local-ranks-filter", "1", "s.py"]
    )
    assert cfg.redirects == Std.ALL and cfg.tee == {0: Std.OUT, 1: Std.ERR}
    assert cfg.local_ranks_filter == {1}


def test_nproc_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_nproc("cpu") == len(os.sched_getaffinity(0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert parse_nproc("gpu") == parse_nproc("auto") == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert parse_nproc("auto") == len(os.sched_getaffinity(0))
    with pytest.raises(UsageError, match="found no GPU"):
        parse_nproc("gpu")


def test_rdzv_conf() -> None:
    assert parse_rdzv_conf("join_timeout=60, last_call_timeout=1,is_host=true") == {
        "join_timeout": "60",
        "last_call_timeout": "1",
        "is_host": "true",
    }
    with pytest.raises(UsageError, match="token_file"):
        parse_rdzv_conf("token=s3cret")


def test_rdzv_conf_has_one_parser_the_rendezvous_one() -> None:
    # The agent must not keep a second, laxer parser that lets values through which the
    # rendezvous rejects later (with a worse message, after the agent started binding ports).
    from xrun.runtime import rendezvous

    assert parse_rdzv_conf is rendezvous.parse_rdzv_conf
    cfg, _, _ = parse(["--rdzv-conf", "heartbeat_interval=1,heartbeat_timeout=3", "s.py"])
    assert rendezvous.config_from_conf(cfg.rdzv_conf).heartbeat_interval == 1.0


_CONF_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "exit_barrier_timeout",
    "heartbeat_interval",
    "heartbeat_timeout",
    "read_timeout",
    "timeout",
    "token_file",
    "is_host",
    "token",
    "bogus",
    "",
)
_CONF_VALUES = st.one_of(
    st.sampled_from(["", "0", "-1", "1", "2.5", "1e9", "inf", "nan", "true", "maybe", "10m", "="]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.sampled_from(_CONF_KEYS), st.text(max_size=6)),
            st.sampled_from(["=", ""]),
            _CONF_VALUES,
        ),
        max_size=4,
    ),
    st.sampled_from([",", ", ", ",,"]),
)
def test_fuzzed_rdzv_conf_is_accepted_or_one_line_usage_error(
    items: list[tuple[str, str, str]], sep: str
) -> None:
    raw = sep.join(f"{k}{eq}{v}" for k, eq, v in items)
    try:
        conf = parse_rdzv_conf(raw)
    except UsageError as e:
        msg = str(e)
        assert msg and "\n" not in msg and "Traceback" not in msg
        return
    from xrun.runtime.rendezvous import config_from_conf

    config_from_conf(conf)  # what parsed is what the rendezvous accepts


def test_worker_env_defaults_and_user_values() -> None:
    group = WorkerGroup(
        role="trainer",
        run_id="job",
        local_world_size=2,
        rank_offset=3,
        world_size=5,
        group_rank=1,
        group_world_size=2,
        master_addr="h0",
        master_port=1234,
        restart_count=1,
        max_restarts=3,
    )
    env = worker_env(group, 1, "/l/1/error.json", environ={})
    assert (
        env["RANK"] == env["ROLE_RANK"] == "4"
        and env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "5"
    )
    assert env["OMP_NUM_THREADS"] == "1" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/l/1/error.json"
    env = worker_env(
        group,
        1,
        "/l/1/error.json",
        environ={"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
    )
    assert env["OMP_NUM_THREADS"] == "8" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert "OMP_NUM_THREADS" not in worker_env(
        group._replace(local_world_size=1), 0, "/l/1/error.json", environ={}
    )


def test_log_line_prefix() -> None:
    assert log_line_prefix(None, "default", 1, 5) == "[default1]:"
    assert log_line_prefix("${role_name}-${rank}|", "w", 1, 5) == "w-5|"


def test_recover_defaults_off_and_parses() -> None:
    cfg, _, _ = parse(["s.py"])
    assert (cfg.recover, cfg.warm_pool_size) == ("off", 0)
    cfg, _, _ = parse(["--recover", "warm", "--warm-pool-size", "3", "s.py"])
    assert (cfg.recover, cfg.warm_pool_size) == ("warm", 3)
    with pytest.raises(UsageError, match="recover 'hot' is invalid"):
        LaunchConfig(recover="hot")


def test_spares_parse() -> None:
    argv = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "s.py"]
    assert parse(argv)[0].spares == 0
    assert parse(["--spares", "3", *argv])[0].spares == 3


def test_launch_config_validates() -> None:
    with pytest.raises(UsageError, match="0 < MIN <= MAX"):
        LaunchConfig(min_nodes=2, max_nodes=1)
    with pytest.raises(UsageError, match="rdzv-endpoint"):
        LaunchConfig(min_nodes=2, max_nodes=2)


BAD = [
    (["--nnodes", "2:1", "s.py"], "'2:1'"),
    (["--nnodes", "x", "s.py"], "'x'"),
    (["-r", "4", "s.py"], "'4'"),
    (["-t", "0:3,7:1", "s.py"], "local rank 7"),
    (["--rdzv-conf", "join_timeout=", "s.py"], "join_timeout=''"),
    (["--rdzv-conf", "is_host=maybe", "s.py"], "is_host='maybe'"),
    (["--rdzv-conf", "token_file=", "s.py"], "token_file= is empty"),
    (["--rdzv-conf", "heartbeat_interval=20", "s.py"], "smaller than heartbeat_timeout=15"),
    (["--rdzv-conf", "token=s3cret", "s.py"], "XRUN_RDZV_TOKEN"),
    (["--rdzv-conf", "join_timeout=10m", "s.py"], "'10m'"),
    (["--nproc-per-node", "x", "s.py"], "'x'"),
    (["--nproc-per-node", "0", "s.py"], "'0'"),
    (["--max-restarts", "-1", "s.py"], "'-1'"),
    (["--shutdown-timeout", "soon", "s.py"], "'soon'"),
    (["--rdzv-backend", "zookeeper", "s.py"], "'zookeeper'"),
    (
        ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999", "s.py"],
        "'h:99999'",
    ),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "s.py"], "--rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "2", "s.py"], "node_rank 2"),
    (["--local-ranks-filter", "5", "s.py"], "'5'"),
    (["--signals-to-handle", "SIGFOO", "s.py"], "'SIGFOO'"),
    (["--no-python", "-m", "s.py"], "--no-python"),
    (["--numa-binding", "node", "s.py"], "--numa-binding"),
    (["--logs-specs", "x", "s.py"], "--logs-specs"),
    (["--event-log-handler", "x", "s.py"], "--event-log-handler"),
    (["--start-method", "thread", "s.py"], "'thread'"),
    (["--recover", "hot", "s.py"], "--recover 'hot' is invalid: expected off or warm"),
    (["--warm-pool-size", "-1", "s.py"], "--warm-pool-size '-1'"),
    (["--warm-pool-size", "5000", "s.py"], "warm_pool_size 5000 is over the limit"),
    (["--spares", "x", "s.py"], "--spares 'x' is invalid"),
    (["--spares", "1", "s.py"], "spares 1 needs the c10d or etcd rendezvous on a shared"),
    (
        ["--nnodes", "2", "--node-rank", "0", "--master-port", "29500", "--spares", "1", "s.py"],
        "backend 'static'",
    ),
    (["--bogus", "s.py"], "--bogus"),
    ([], "training_script"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) or "empty" for a, _ in BAD])
def test_bad_flags_fail_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("xrun-agent: error: ") and needle in lines[0], lines[0]
    assert out == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["--nnodes", "2:1"],
        ["-r", "4"],
        ["--rdzv-conf", "join_timeout="],
        ["--nproc-per-node", "x"],
        ["--numa-binding", "node"],
    ],
)
def test_bad_flags_from_the_command_line(argv: list[str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "xrun.runtime", *argv, "s.py"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("xrun-agent: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_help() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "xrun.runtime", "--help"], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0 and "--nproc-per-node" in p.stdout and "PET_" in p.stdout
