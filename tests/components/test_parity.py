"""The builtin components where TorchX 0.7.0 defines the behaviour: static rendezvous,
``--name EXPERIMENT/RUN``, ``LOGLEVEL``, utils' resources, and who owns ``--max_retries``
(the AppDef, and the docker and slurm requests built from it)."""

from __future__ import annotations

import pytest

from xrun.components import dist, utils
from xrun.contract import RESTARTS_IN_PLACE
from xrun.errors import UsageError
from xrun.schedulers.api import get_scheduler, scheduler_retries
from xrun.schedulers.docker.options import DockerOptions
from xrun.schedulers.docker.request import materialize
from xrun.schedulers.slurm.options import SlurmOptions
from xrun.schedulers.slurm.request import ClusterInfo, build_request, requeue_limits
from xrun.specs import AppDef, Resource, Role, macros


def cmd_of(app: AppDef) -> str:
    return app.roles[0].args[1]


# --------------------------------------------------------------------------- static rendezvous
def test_static_backend_gives_each_replica_its_node_rank() -> None:
    app = dist.ddp(script="t.py", j="2x2", rdzv_backend="static", rdzv_port=1234)
    cmd = cmd_of(app)
    assert "--rdzv-backend static --rdzv-endpoint ${${rank0_env}}:1234 " in cmd
    assert "--node-rank ${replica_id} " in cmd
    per_replica = [
        macros.Values(img_root="", app_id="a", replica_id=str(i), rank0_env="H")
        .apply(app.roles[0])
        .args[1]
        for i in range(2)
    ]
    assert "--node-rank 0 " in per_replica[0] and "--node-rank 1 " in per_replica[1]
    assert "--node-rank" not in cmd_of(dist.ddp(script="t.py", j="2x2"))  # c10d: agents rank


def test_static_backend_refuses_an_elastic_size() -> None:
    with pytest.raises(UsageError, match="static needs a fixed node count.*1 to 2 nodes"):
        dist.ddp(script="t.py", j="1:2x2", rdzv_backend="static")


# --------------------------------------------------------------------------- names and env
def test_name_is_experiment_slash_run_as_in_torchx() -> None:
    app = dist.ddp(script="dir/train.py", name="resnet/trial_1")
    assert app.name == "trial_1" and app.roles[0].name == "train"
    assert app.roles[0].env["TORCHX_TRACKING_EXPERIMENT_NAME"] == "resnet"
    app = dist.ddp(m="pkg.trainer", name="trial_2")
    assert app.name == "trial_2" and app.roles[0].name == "trainer"
    assert app.roles[0].env["TORCHX_TRACKING_EXPERIMENT_NAME"] == "default-experiment"
    spmd = dist.spmd(script="t.py", name="e/")
    assert spmd.name == "t" and spmd.roles[0].env["TORCHX_TRACKING_EXPERIMENT_NAME"] == "e"


def test_loglevel_defaults_to_the_submitter_s_or_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOGLEVEL", raising=False)
    assert dist.ddp(script="t.py").roles[0].env["LOGLEVEL"] == "WARNING"
    assert utils.sh("true").roles[0].env["LOGLEVEL"] == "WARNING"
    monkeypatch.setenv("LOGLEVEL", "INFO")
    assert dist.ddp(script="t.py").roles[0].env["LOGLEVEL"] == "INFO"
    given = dist.ddp(script="t.py", env={"LOGLEVEL": "DEBUG"}).roles[0].env
    assert given["LOGLEVEL"] == "DEBUG"


def test_spmd_takes_nnodes_x_nproc_too() -> None:
    app = dist.spmd(script="t.py", j="2x4", h="gpu.small")
    assert app.roles[0].num_replicas == 2 and "--nproc-per-node 4 " in cmd_of(app)
    assert "--nproc-per-node 8 " in cmd_of(dist.spmd(script="t.py", j="2", h="gpu.xlarge"))
    assert "--nnodes 1:3 " in cmd_of(dist.spmd(script="t.py", j="1:3x2"))


# --------------------------------------------------------------------------- utils' resources
def test_echo_touch_copy_ask_for_one_cpu_and_one_gib() -> None:
    one = Resource(cpu=1, gpu=0, memMB=1024)
    for app in (utils.echo(), utils.touch("f"), utils.copy("a", "b")):
        assert app.roles[0].resource == one, app.name
    script = get_scheduler("slurm", "t").submit_dryrun(utils.echo(), {}).request.script
    assert "#SBATCH --cpus-per-task=1\n" in script and "#SBATCH --mem=1024M\n" in script


# --------------------------------------------------------------------------- retries: one owner
def test_dist_roles_restart_in_place_so_schedulers_add_no_retries() -> None:
    app = dist.ddp(script="t.py", j="2x1", max_retries=3)
    role = app.roles[0]
    assert role.max_retries == 3 and role.metadata[RESTARTS_IN_PLACE] is True
    assert "--max-restarts 3 " in cmd_of(app)
    assert scheduler_retries(role) == 0
    plain = utils.sh("false", max_retries=3).roles[0]
    assert scheduler_retries(plain) == 3
    # docker: no restart policy for the agent's role, on-failure:N for the plain one
    ddp_job = materialize(app, "a-1", DockerOptions())
    assert all(c.restart_policy() is None for c in ddp_job.containers)
    assert "--restart" not in str(ddp_job)
    sh_job = materialize(utils.sh("false", max_retries=3), "a-2", DockerOptions())
    assert sh_job.containers[0].restart_policy() == {
        "Name": "on-failure",
        "MaximumRetryCount": 3,
    }


def _slurm(app: AppDef) -> str:
    return build_request(app, SlurmOptions(signal=None), "/w", ClusterInfo(), None).script


def test_slurm_requeues_a_failed_dist_job_never_and_a_preempted_one_up_to_n() -> None:
    script = _slurm(dist.ddp(script="t.py", j="2x1", max_retries=2))
    assert "#SBATCH --requeue\n" in script
    assert 'if [ "$XRUN_PREEMPTED" -eq 1 ]; then\n    XRUN_RETRIES=2\n' in script
    assert 'elif [ "$XRUN_RC" -ne 0 ]; then\n    XRUN_RETRIES=0\n' in script
    plain = _slurm(utils.sh("false", max_retries=2))
    assert 'elif [ "$XRUN_RC" -ne 0 ]; then\n    XRUN_RETRIES=2\n' in plain


def test_slurm_multi_role_job_takes_the_smallest_retries() -> None:
    app = AppDef(
        "two",
        [
            Role("a", "", "true", max_retries=3),
            Role("b", "", "true", max_retries=1),
        ],
    )
    assert requeue_limits(app) == (1, 1)
    assert "XRUN_RETRIES=1\nelif" in _slurm(app)
    app.roles[1].max_retries = 0
    assert requeue_limits(app) == (0, 0) and "#SBATCH --no-requeue\n" in _slurm(app)
