"""torch 2.13's launcher as a library: ``torch.distributed.run.main`` and
``torch.distributed.launcher.api`` (``LaunchConfig``, ``elastic_launch``, ``launch_agent``).
Runs against xrun, or torch (``XRUN_COMPAT_TARGET=torch``)."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tests.compat import shim
from tests.compat.helpers import env_of, script
from tests.compat.shim import ChildFailedError, LaunchConfig, elastic_launch, launch_agent, run
from tests.helpers.net import free_port


def _config(**kw):
    base = dict(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        rdzv_backend="c10d",
        rdzv_endpoint=f"localhost:{free_port()}",
        max_restarts=0,
        monitor_interval=0.1,
    )
    base.update(kw)
    return LaunchConfig(**base)


@pytest.mark.timeout(120)
def test_launch_config_without_run_id_makes_one():
    keys = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "TORCHELASTIC_SIGNALS_TO_HANDLE")
    out = elastic_launch(_config(signals_to_handle="SIGTERM,SIGUSR1"), env_of)(keys)
    run_ids = {v["TORCHELASTIC_RUN_ID"] for v in out.values()}
    assert len(run_ids) == 1 and run_ids != {""} and run_ids != {None}
    assert {r: v["RANK"] for r, v in out.items()} == {0: "0", 1: "1"}
    # the launcher's signals reach the workers' env, as torchrun sets it
    assert {v["TORCHELASTIC_SIGNALS_TO_HANDLE"] for v in out.values()} == {"SIGTERM,SIGUSR1"}


@pytest.mark.timeout(120)
def test_static_rendezvous_takes_its_node_rank_from_rdzv_configs():
    cfg = _config(
        rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_configs={"rank": 0}
    )
    out = launch_agent(cfg, env_of, [("GROUP_RANK", "WORLD_SIZE")])
    assert out == {r: {"GROUP_RANK": "0", "WORLD_SIZE": "2"} for r in range(2)}


@pytest.mark.timeout(120)
def test_failed_workers_raise_child_failed_error(tmp_path):
    worker = script(tmp_path, "w.py", "import sys; sys.exit(5)\n")
    with pytest.raises(ChildFailedError) as info:
        elastic_launch(_config(nproc_per_node=1), worker)()
    rank, failure = info.value.get_first_failure()
    assert (rank, failure.exitcode) == (0, 5)


@pytest.mark.timeout(120)
def test_run_main_runs_torchrun_flags_and_tees_through_sys_stdout(tmp_path, monkeypatch):
    worker = script(tmp_path, "w.py", "import os; print('hello from', os.environ['RANK'])\n")
    monkeypatch.setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${rank}> ")
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        run.main(
            [
                "--nproc-per-node=2",
                "--no-python",
                "--tee=3",
                f"--log-dir={tmp_path / 'logs'}",
                # keys torchrun's c10d backend reads are accepted (keep_alive_* by xrun too)
                "--rdzv-conf=keep_alive_interval=5,keep_alive_max_attempt=3,store_type=tcp",
                worker,
            ]
        )
    assert "<0> hello from 0\n" in out.getvalue() and "<1> hello from 1\n" in out.getvalue()


@pytest.mark.timeout(120)
def test_run_main_substitutes_local_rank_macros(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        """
        import os, sys
        with open(os.path.join(sys.argv[1], os.environ["LOCAL_RANK"]), "w") as fp:
            fp.write(" ".join(sys.argv[2:]))
        """,
    )
    with redirect_stderr(io.StringIO()):
        run.main(
            [
                "--nproc-per-node=2",
                "--no-python",
                worker,
                str(tmp_path),
                "$local_rank",
                "${local_rank}",
                "$$5",
                "a$local_rank",
            ]
        )
    assert (tmp_path / "0").read_text() == "0 0 $5 a0"
    assert (tmp_path / "1").read_text() == "1 1 $5 a1"


def test_run_main_raises_value_error_for_bad_flags(tmp_path):
    with pytest.raises(ValueError):
        run.main(["--no-python", "--module", "x.py"])
    with pytest.raises(ValueError):
        run.main(["--nproc-per-node=unknown", "x.py"])
    with pytest.raises(ValueError):
        run.main(["--logs-specs=DOES_NOT_EXIST", "--no-python", "x.py"])


@pytest.mark.timeout(120)
def test_virtual_local_rank_gives_each_worker_one_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    keys = ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "RANK")
    out = launch_agent(_config(virtual_local_rank=True), env_of, [keys])
    assert out == {
        0: {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "5", "RANK": "0"},
        1: {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "7", "RANK": "1"},
    }


def test_entrypoint_name():
    assert shim._get_entrypoint_name(env_of, []) == "env_of"
    assert shim._get_entrypoint_name(sys.executable, ["-u"]) == ""
    assert shim._get_entrypoint_name(sys.executable, ["-u", "-m", "train"]) == "train"
    assert shim._get_entrypoint_name("/bin/echo", ["x"]) == "/bin/echo"
    assert shim._get_entrypoint_name(None, []) == ""
    assert os.path.basename(shim._get_entrypoint_name(sys.executable, ["-u", "/a/b.py"])) == "b.py"
