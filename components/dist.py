"""Distributed training components: ``dist.ddp`` and ``dist.spmd``.

Both build ONE role whose replicas each run xrun's runtime agent (``python3 -m xrun.runtime``,
a torchrun equivalent) through ``sh -c``::

    sh -c 'exec python3 -m xrun.runtime --nnodes 1:2 --nproc-per-node 4 --rdzv-backend c10d
           --rdzv-endpoint ${XRUN_RANK0_HOST}:29500 --rdzv-id <app id> --max-restarts 0
           --tee 3 train.py --lr 0.1'

Why a shell: on several nodes the rendezvous host is only known inside the replica. The spec
says ``${${rank0_env}}``; the scheduler's macro substitution turns ``${rank0_env}`` into the
*name* of the env var it sets to the first replica's host (e.g. ``XRUN_RANK0_HOST``), and the
replica's shell expands it. One node uses ``localhost:0`` (the agent picks a free port).
The script's arguments are shell-quoted, so ``"a b"`` stays one argument; ``${app_id}`` and
the other macros are still substituted in them, and a literal ``$$`` stays ``$$``.
"""

from __future__ import annotations

import os
import re
import shlex

from xrun.components import DEFAULT_IMAGE
from xrun.contract import MASTER_PORT_DEFAULT, RDZV_BACKENDS, RDZV_PORT_ENV
from xrun.errors import UsageError
from xrun.jobspec import JobSize, parse_j, parse_nnodes
from xrun.named_resources import get_named_resource
from xrun.specs import AppDef, Resource, Role, macros, parse_mounts

# Set by debug=True: what one usually exports by hand to see why a distributed job hangs.
DEBUG_ENV = {
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "NCCL_DEBUG": "INFO",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
    "CUDA_LAUNCH_BLOCKING": "1",
}


def ddp(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    h: str | None = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    rdzv_conf: str | None = None,
    mounts: list[str] | None = None,
    debug: bool = False,
    tee: int = 3,
) -> AppDef:
    """Distributed data parallel: NNODES replicas, each running NPROC workers of a script.

    Args:
        script_args: arguments passed to the script or module
        script: the training script (a path, relative to the job's working directory)
        m: run this Python module instead of a script (like ``python -m``)
        image: container image (docker); local_cwd and slurm ignore it
        name: APP/ROLE names; an empty part is derived from the script or module name
        h: a named resource (e.g. gpu.small, see named_resources); overrides cpu, gpu and memMB
        cpu: CPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        j: [[MIN:]NNODES x]NPROC, e.g. 4, 2x4 or 1:3x8 (elastic)
        env: environment variables, k=v,k2=v2
        max_retries: how many times the worker group restarts before the job fails
        rdzv_port: the rendezvous port on the first replica (multi-node only; left at the default, local_cwd picks a free one per app)
        rdzv_backend: c10d or static
        rdzv_conf: extra rendezvous settings, e.g. join_timeout=600,last_call_timeout=30
        mounts: docker-style mounts, type=bind,src=/a,dst=/b[,readonly] (several: repeat type=)
        debug: set torch/NCCL debug environment variables
        tee: which worker streams also go to the console: 0 none, 1 stdout, 2 stderr, 3 both
    """
    size = parse_j(j)
    resource = get_named_resource(h) if h else Resource(cpu=cpu, gpu=gpu, memMB=memMB)
    return _app(
        "dist.ddp",
        script_args,
        script,
        m,
        image,
        name,
        resource,
        size,
        env,
        max_retries,
        rdzv_port,
        rdzv_backend,
        rdzv_conf,
        mounts,
        debug,
        tee,
    )


def spmd(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    h: str = "gpu.small",
    j: str = "1",
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    mounts: list[str] | None = None,
    debug: bool = False,
) -> AppDef:
    """SPMD: one worker per GPU of the named resource, on [MIN:]NNODES nodes.

    The processes per node are not given: they are the GPU count of ``h`` (gpu.small: 1,
    gpu.xlarge: 8; a CPU-only resource runs 1).

    Args:
        script_args: arguments passed to the script or module
        script: the training script
        m: run this Python module instead of a script
        image: container image (docker); local_cwd and slurm ignore it
        name: APP/ROLE names; an empty part is derived from the script or module name
        h: a named resource; its GPU count is the number of workers per node
        j: [MIN:]NNODES, e.g. 2 or 1:4 (elastic)
        env: environment variables, k=v,k2=v2
        max_retries: how many times the worker group restarts before the job fails
        rdzv_port: the rendezvous port on the first replica (multi-node only; left at the default, local_cwd picks a free one per app)
        mounts: docker-style mounts, type=bind,src=/a,dst=/b[,readonly]
        debug: set torch/NCCL debug environment variables
    """
    resource = get_named_resource(h)
    lo, hi = parse_nnodes(j)
    size = JobSize(lo, hi, max(resource.gpu, 1))
    return _app(
        "dist.spmd",
        script_args,
        script,
        m,
        image,
        name,
        resource,
        size,
        env,
        max_retries,
        rdzv_port,
        "c10d",
        None,
        mounts,
        debug,
        3,
    )


def _app(
    component: str,
    script_args: tuple[str, ...],
    script: str | None,
    m: str | None,
    image: str,
    name: str,
    resource: Resource,
    size: JobSize,
    env: dict[str, str] | None,
    max_retries: int,
    rdzv_port: int,
    rdzv_backend: str,
    rdzv_conf: str | None,
    mounts: list[str] | None,
    debug: bool,
    tee: int,
) -> AppDef:
    if (script is None) == (m is None):
        got = "both" if script is not None else "neither"
        raise UsageError(f"{component}: give exactly one of --script FILE or -m MODULE (got {got})")
    if rdzv_backend not in RDZV_BACKENDS:
        raise UsageError(
            f"{component}: --rdzv_backend {rdzv_backend!r} is not supported; use one of "
            f"{', '.join(RDZV_BACKENDS)}"
        )
    if not 0 <= tee <= 3:
        raise UsageError(f"{component}: --tee {tee} is invalid; expected 0, 1, 2 or 3")
    if not 0 < rdzv_port < 65536:
        raise UsageError(f"{component}: --rdzv_port {rdzv_port} is invalid; expected 1..65535")
    if max_retries < 0:
        raise UsageError(f"{component}: --max_retries {max_retries} is invalid; expected >= 0")
    app_name, role_name = _names(name, script, m)
    multi_node = size.max_nnodes > 1
    # One node: a private rendezvous on a free port. Several: the first replica's host, which
    # the replica's shell reads from the env var the scheduler names through ${rank0_env}.
    # The default port defers to XRUN_RDZV_PORT when a scheduler sets it: local_cwd runs every
    # replica on this host and gives each multi-node app a free port, so that two such apps
    # never meet on 29500. A port the user chose is used as it is.
    port = (
        f"${{{RDZV_PORT_ENV}:-{rdzv_port}}}" if rdzv_port == MASTER_PORT_DEFAULT else str(rdzv_port)
    )
    endpoint = f"${{{macros.rank0_env}}}:{port}" if multi_node else "localhost:0"
    cmd = [
        "exec",
        "python3",
        "-m",
        "xrun.runtime",
        "--nnodes",
        size.nnodes_arg(),
        "--nproc-per-node",
        str(size.nproc_per_node),
        "--rdzv-backend",
        rdzv_backend,
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        macros.app_id,
        "--max-restarts",
        str(max_retries),
        "--tee",
        str(tee),
    ]
    if rdzv_conf:
        cmd += ["--rdzv-conf", shlex.quote(rdzv_conf)]
    cmd += [shlex.quote(script)] if script is not None else ["-m", shlex.quote(str(m))]
    cmd += [quote_arg(a) for a in script_args]
    role_env = {**(DEBUG_ENV if debug else {}), **(env or {})}
    role = Role(
        name=role_name,
        image=image,
        entrypoint="sh",
        args=["-c", " ".join(cmd)],
        env=role_env,
        num_replicas=size.max_nnodes,
        min_replicas=size.min_nnodes,
        max_retries=max_retries,
        resource=resource,
        port_map={"c10d": rdzv_port} if multi_node else {},
        mounts=list(parse_mounts(mounts or [])),
    )
    return AppDef(name=app_name, roles=[role])


def quote_arg(arg: str) -> str:
    """Quote one script argument for ``sh -c``; ``$$`` doubled so macros keep it literal."""
    return shlex.quote(arg).replace("$$", "$$$$")


def _names(name: str, script: str | None, m: str | None) -> tuple[str, str]:
    """``APP/ROLE`` -> (app, role); an empty part (and a missing ROLE) comes from the entry."""
    if script is not None:
        base = os.path.splitext(os.path.basename(script.rstrip("/")))[0]
    else:
        base = str(m).rsplit(".", 1)[-1]
    derived = _sanitize(base)
    app, _, role = name.partition("/")
    return app or derived, role or derived


def _sanitize(text: str) -> str:
    """A valid role/app name: letters, digits, '_', '.', '-', starting with a letter/digit."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text).lstrip("_.-")
    return cleaned or "app"
