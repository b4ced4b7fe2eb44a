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
from collections.abc import Mapping

from xrun.contract import (
    ETCD_BACKENDS,
    EXPERIMENT_ENV,
    MASTER_PORT_DEFAULT,
    MAX_DURATION_S,
    MAX_NODES,
    MAX_NPROC_PER_NODE,
    RDZV_BACKENDS,
    RDZV_PORT_ENV,
    RECOVER_MODES,
    RESTARTS_IN_PLACE,
    SCRIPT,
    SPARES,
)
from xrun.errors import UsageError
from xrun.record import Value
from xrun.specs import AppDef, Resource, Role, macros, parse_mounts
from xrun.specs.jobspec import JobSize, parse_j, parse_nnodes
from xrun.specs.named_resources import get_named_resource

from . import DEFAULT_IMAGE

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
    rdzv_port: int = MASTER_PORT_DEFAULT,
    rdzv_backend: str = "c10d",
    rdzv_conf: str | None = None,
    mounts: list[str] | None = None,
    debug: bool = False,
    tee: int = 3,
    stall_timeout: int = 0,
    stall_silent_timeout: int = 0,
    recover: str = "off",
    spares: int = 0,
    rdzv_endpoint: str | None = None,
) -> AppDef:
    """Distributed data parallel: NNODES replicas, each running NPROC workers of a script.

    Args:
        script_args: arguments passed to the script or module
        script: the training script (a path, relative to the job's working directory)
        m: run this Python module instead of a script (like ``python -m``)
        image: container image (docker); local_cwd and slurm ignore it
        name: EXPERIMENT/RUN, EXPERIMENT/, /RUN or RUN: the app is named RUN (default: the script or module name), the experiment is exported as TORCHX_TRACKING_EXPERIMENT_NAME (default: default-experiment)
        h: a named resource (e.g. gpu.small, see named_resources); overrides cpu, gpu and memMB
        cpu: CPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        j: [[MIN:]NNODES x]NPROC, e.g. 4, 2x4 or 1:3x8 (elastic)
        env: environment variables, k=v,k2=v2 or k=v;k2=v2 (LOGLEVEL defaults to $LOGLEVEL or WARNING)
        max_retries: how many times the workers are restarted after a failure, in place by each replica's agent (--max-restarts) on every scheduler: max_retries + 1 attempts in all; slurm also requeues a preempted job up to max_retries times
        rdzv_port: the rendezvous port on the first replica (multi-node only; left at the default, local_cwd picks a free one per app)
        rdzv_backend: c10d, static (a fixed node count; replica i is node rank i) or etcd (the rendezvous kept in an etcd the cluster runs, --rdzv_endpoint; no replica is a single point of failure)
        rdzv_conf: extra rendezvous settings, e.g. join_timeout=600,last_call_timeout=30
        mounts: docker-style mounts, type=bind,src=/a,dst=/b[,readonly] (several: repeat type=)
        debug: set torch/NCCL debug environment variables
        tee: which worker streams also go to the console: 0 none, 1 stdout, 2 stderr, 3 both
        stall_timeout: seconds in which no worker works (CPU, I/O) nor shows a sign of life (a line, a write, a beat) before the attempt ends with every rank's stack as its root cause; a silent start-up or busy phase has max(10x, 600 s) (the agent's --stall-timeout, docs/diagnose.md); 0: off
        stall_silent_timeout: with stall_timeout, seconds the workers may show no sign of life (no line, write, beat or timer request) at all, busy or not, before the attempt ends the same way (the agent's --stall-silent-timeout); 0: max(10 x stall_timeout, 600 s)
        recover: how a failed attempt's workers are replaced: off (cold interpreters, as torchrun) or warm (pre-started interpreters that imported what the workers import; the agents, the store and the rendezvous stay; costs one idle interpreter per worker, see docs/runtime.md)
        spares: spare replicas beside NNODES (c10d or etcd): the replicas that arrive while the NNODES seats are taken park, using no CPU, and one takes the node rank and RANKs of a node that is lost (the agent's --spares, docs/runtime.md; with c10d not the first replica's, whose agent serves the store: with etcd any)
        rdzv_endpoint: etcd's client HOST:PORT for --rdzv_backend etcd (required there; every replica must reach it); c10d and static meet at the first replica
    """
    size = parse_j(j)
    resource = get_named_resource(h) if h else Resource(cpu=cpu, gpu=gpu, memMB=memMB)
    return _app(
        DistJob(
            component="dist.ddp",
            script=script,
            module=m,
            script_args=script_args,
            image=image,
            name=name,
            resource=resource,
            size=size,
            env=env or {},
            max_retries=max_retries,
            rdzv_port=rdzv_port,
            rdzv_backend=rdzv_backend,
            rdzv_conf=rdzv_conf,
            mounts=tuple(mounts or ()),
            debug=debug,
            tee=tee,
            stall_timeout=stall_timeout,
            stall_silent_timeout=stall_silent_timeout,
            recover=recover,
            spares=spares,
            rdzv_endpoint=rdzv_endpoint,
        )
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
    rdzv_port: int = MASTER_PORT_DEFAULT,
    mounts: list[str] | None = None,
    debug: bool = False,
    stall_timeout: int = 0,
    stall_silent_timeout: int = 0,
) -> AppDef:
    """SPMD: one worker per GPU of the named resource, on [MIN:]NNODES nodes.

    Without ``xNPROC`` in ``-j`` the processes per node are the GPU count of ``h`` (gpu.small:
    1, gpu.xlarge: 8; a CPU-only resource runs 1).

    Args:
        script_args: arguments passed to the script or module
        script: the training script
        m: run this Python module instead of a script
        image: container image (docker); local_cwd and slurm ignore it
        name: EXPERIMENT/RUN, EXPERIMENT/, /RUN or RUN (see dist.ddp)
        h: a named resource; its GPU count is the number of workers per node
        j: [MIN:]NNODES[xNPROC], e.g. 2, 1:4 (elastic) or 2x4 (NPROC given, not the GPU count)
        env: environment variables, k=v,k2=v2 or k=v;k2=v2
        max_retries: how many times the workers are restarted after a failure (see dist.ddp): max_retries + 1 attempts in all
        rdzv_port: the rendezvous port on the first replica (multi-node only; left at the default, local_cwd picks a free one per app)
        mounts: docker-style mounts, type=bind,src=/a,dst=/b[,readonly]
        debug: set torch/NCCL debug environment variables
        stall_timeout: seconds in which no worker works nor shows a sign of life before the attempt ends with every rank's stack as its root cause (see dist.ddp); 0: off
        stall_silent_timeout: with stall_timeout, seconds without any sign of life before the attempt ends (see dist.ddp); 0: max(10 x stall_timeout, 600 s)
    """
    resource = get_named_resource(h)
    if "x" in j:  # NPROC given: as TorchX, it wins over the GPU count
        size = parse_j(j)
    else:
        nodes = parse_nnodes(j)
        size = JobSize(nodes.min, nodes.max, max(resource.gpu, 1))
    return _app(
        DistJob(
            component="dist.spmd",
            script=script,
            module=m,
            script_args=script_args,
            image=image,
            name=name,
            resource=resource,
            size=size,
            env=env or {},
            max_retries=max_retries,
            rdzv_port=rdzv_port,
            mounts=tuple(mounts or ()),
            debug=debug,
            stall_timeout=stall_timeout,
            stall_silent_timeout=stall_silent_timeout,
        )
    )


# DistJob's default env: shared, and safe to share (a Value is never changed).
_NO_ENV: Mapping[str, str] = {}


class DistJob(Value):
    """What ``dist.ddp`` and ``dist.spmd`` ask for, once their own options are resolved: the
    one input of the role builder below. A :class:`xrun.record.Value`: a dataclass costs every
    dry run and local run (benchmarks 1 and 5) ~1 ms to make."""

    component: str  # the component's name, for error messages
    script: str | None
    module: str | None
    script_args: tuple[str, ...]
    image: str
    name: str
    resource: Resource
    size: JobSize
    env: Mapping[str, str] = _NO_ENV
    max_retries: int = 0
    rdzv_port: int = MASTER_PORT_DEFAULT
    rdzv_backend: str = "c10d"
    rdzv_conf: str | None = None
    mounts: tuple[str, ...] = ()
    debug: bool = False
    tee: int = 3
    stall_timeout: int = 0  # the agent's --stall-timeout; 0: off
    stall_silent_timeout: int = 0  # the agent's --stall-silent-timeout; 0: its default
    recover: str = "off"  # the agent's --recover: off or warm
    spares: int = 0  # the agent's --spares: spare replicas beside the job's nodes
    rdzv_endpoint: str | None = None  # etcd's HOST:PORT (--rdzv_backend etcd)

    def validate(self) -> None:
        """UsageError naming the option, its value and the expected form."""
        c = self.component
        if (self.script is None) == (self.module is None):
            got = "both" if self.script is not None else "neither"
            raise UsageError(f"{c}: give exactly one of --script FILE or -m MODULE (got {got})")
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise UsageError(
                f"{c}: --rdzv_backend {self.rdzv_backend!r} is not supported; use one of "
                f"{', '.join(RDZV_BACKENDS)}"
            )
        self._check_endpoint()
        if not 0 <= self.tee <= 3:
            raise UsageError(f"{c}: --tee {self.tee} is invalid; expected 0, 1, 2 or 3")
        if not 0 < self.rdzv_port < 65536:
            raise UsageError(f"{c}: --rdzv_port {self.rdzv_port} is invalid; expected 1..65535")
        if not 0 <= self.stall_timeout <= MAX_DURATION_S:
            raise UsageError(
                f"{c}: --stall_timeout {self.stall_timeout} is invalid; expected seconds from 0 "
                f"(off) to {MAX_DURATION_S:g}"
            )
        if not 0 <= self.stall_silent_timeout <= MAX_DURATION_S:
            raise UsageError(
                f"{c}: --stall_silent_timeout {self.stall_silent_timeout} is invalid; expected "
                f"seconds from 0 (the default: max(10 x --stall_timeout, 600)) to "
                f"{MAX_DURATION_S:g}"
            )
        if self.stall_silent_timeout and not self.stall_timeout:
            raise UsageError(
                f"{c}: --stall_silent_timeout {self.stall_silent_timeout} needs --stall_timeout: "
                "the watchdog is off without it"
            )
        if self.recover not in RECOVER_MODES:
            raise UsageError(
                f"{c}: --recover {self.recover!r} is invalid; expected {' or '.join(RECOVER_MODES)}"
            )
        if self.max_retries < 0:
            raise UsageError(f"{c}: --max_retries {self.max_retries} is invalid; expected >= 0")
        self._check_spares()
        if self.rdzv_conf:
            # The agent's own parser (standard library only; imported only when needed), so a
            # value the agent would refuse in the job is refused here, before anything is
            # submitted; strict: a key no backend knows is a typo here, not a warning there.
            from xrun.runtime.rendezvous.conf import parse_rdzv_conf

            try:
                parse_rdzv_conf(self.rdzv_conf, strict=True)
            except UsageError as e:
                raise UsageError(f"{c}: {e}") from None
        if self.size.max_nnodes > MAX_NODES or self.size.nproc_per_node > MAX_NPROC_PER_NODE:
            raise UsageError(
                f"{c}: {self.size} is over the limits of {MAX_NODES:,} nodes and "
                f"{MAX_NPROC_PER_NODE:,} processes per node (-j, or the named resource's GPUs)"
            )
        if self.rdzv_backend == "static" and self.size.min_nnodes != self.size.max_nnodes:
            raise UsageError(
                f"{c}: --rdzv_backend static needs a fixed node count, but -j asks for "
                f"{self.size.min_nnodes} to {self.size.max_nnodes} nodes; give -j NNODESxNPROC "
                "or use --rdzv_backend c10d (elastic)"
            )

    def _check_endpoint(self) -> None:
        """etcd's endpoint is the user's (etcd runs outside the job); c10d and static meet at
        the first replica, whose host the scheduler names."""
        c, ep = self.component, self.rdzv_endpoint
        if self.rdzv_backend in ETCD_BACKENDS and not ep:
            raise UsageError(
                f"{c}: --rdzv_backend {self.rdzv_backend} needs --rdzv_endpoint ETCD_HOST:PORT "
                "(etcd's client endpoint, e.g. etcd.example.com:2379), reachable from every replica"
            )
        if ep is None:
            return
        if self.rdzv_backend not in ETCD_BACKENDS:
            raise UsageError(
                f"{c}: --rdzv_endpoint {ep!r} is for --rdzv_backend etcd; {self.rdzv_backend} "
                "meets at the first replica (drop --rdzv_endpoint, or give --rdzv_port)"
            )
        host, _, port = ep.rpartition(":")
        if (
            not host
            or not port.isdigit()
            or not 0 < int(port) < 65536
            or any(ch.isspace() or ch in "'\"$`;&|" for ch in ep)
        ):
            raise UsageError(
                f"{c}: --rdzv_endpoint {ep!r} is invalid; expected etcd's HOST:PORT, e.g. "
                "etcd.example.com:2379"
            )

    def _check_spares(self) -> None:
        c = self.component
        if not 0 <= self.spares <= MAX_NODES:
            raise UsageError(
                f"{c}: --spares {self.spares} is invalid; expected 0 to {MAX_NODES:,} replicas"
            )
        if self.spares and self.rdzv_backend not in ("c10d", *ETCD_BACKENDS):
            raise UsageError(
                f"{c}: --spares needs --rdzv_backend c10d or etcd (got {self.rdzv_backend!r}): "
                "a spare takes whichever node rank is lost"
            )

    @property
    def multi_node(self) -> bool:
        return self.size.max_nnodes + self.spares > 1

    def endpoint(self) -> str:
        """The rendezvous endpoint the replicas' agents meet at.

        One node: a private rendezvous on a free port. Several: the first replica's host, which
        the replica's shell reads from the env var the scheduler names through ${rank0_env}.
        The default port defers to XRUN_RDZV_PORT when a scheduler sets it: local_cwd runs every
        replica on this host and gives each multi-node app a free port, so that two such apps
        never meet on 29500. A port the user chose is used as it is.
        """
        if self.rdzv_endpoint is not None:  # etcd's (validated: HOST:PORT, nothing to quote)
            return self.rdzv_endpoint
        if not self.multi_node:
            return "localhost:0"
        port = self.rdzv_port
        port_s = f"${{{RDZV_PORT_ENV}:-{port}}}" if port == MASTER_PORT_DEFAULT else str(port)
        return f"${{{macros.rank0_env}}}:{port_s}"

    def runtime_command(self) -> str:
        """The replica's ``sh -c`` command: xrun's runtime agent, then the script's arguments."""
        cmd = [
            "exec",
            "python3",
            "-m",
            "xrun.runtime",
            "--nnodes",
            self.size.nnodes_arg(),
            "--nproc-per-node",
            str(self.size.nproc_per_node),
            "--rdzv-backend",
            self.rdzv_backend,
            "--rdzv-endpoint",
            self.endpoint(),
            "--rdzv-id",
            macros.app_id,
            "--max-restarts",
            str(self.max_retries),
            "--tee",
            str(self.tee),
            # An empty role, as TorchX's dist.ddp gives torchrun: ROLE_NAME='' and each worker
            # line's prefix is `[1]:` in both tools' logs (the agent's own default: `[default1]:`).
            "--role",
            "''",
        ]
        if self.rdzv_backend == "static":
            # Each replica is one node rank of a fixed world: replica 0 serves the store at the
            # endpoint, the others connect to it (as TorchX's --node_rank ${replica_id}).
            cmd += ["--node-rank", macros.replica_id]
        if self.rdzv_conf:
            cmd += ["--rdzv-conf", shlex.quote(self.rdzv_conf)]
        if self.stall_timeout:
            cmd += ["--stall-timeout", str(self.stall_timeout)]
        if self.stall_silent_timeout:
            cmd += ["--stall-silent-timeout", str(self.stall_silent_timeout)]
        if self.recover != "off":
            cmd += ["--recover", self.recover]
        if self.spares:
            cmd += ["--spares", str(self.spares)]
        if self.script is not None:
            cmd += [shlex.quote(self.script)]
        else:
            cmd += ["-m", shlex.quote(str(self.module))]
        cmd += [quote_arg(a) for a in self.script_args]
        return " ".join(cmd)


# The experiment of a --name without one (TorchX's default).
DEFAULT_EXPERIMENT = "default-experiment"


def _app(job: DistJob) -> AppDef:
    job.validate()
    experiment, run = split_name(job.name, job.script, job.module)
    env = {**(DEBUG_ENV if job.debug else {}), **job.env}
    env[EXPERIMENT_ENV] = experiment
    env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    role = Role(
        name=_sanitize(_entry_name(job.script, job.module)),
        image=job.image,
        entrypoint="sh",
        args=["-c", job.runtime_command()],
        env=env,
        num_replicas=job.size.max_nnodes + job.spares,  # the spares' agents park (--spares)
        min_replicas=job.size.min_nnodes,
        max_retries=job.max_retries,
        resource=job.resource,
        port_map={"c10d": job.rdzv_port} if job.multi_node else {},
        mounts=list(parse_mounts(list(job.mounts))),
        # The agents restart the workers in place (--max-restarts): the scheduler must not
        # run a failed replica again on top of that (see xrun.contract).
        metadata={
            RESTARTS_IN_PLACE: True,
            **({SCRIPT: job.script} if job.script else {}),
            **({SPARES: job.spares} if job.spares else {}),
        },
    )
    return AppDef(name=run, roles=[role])


def quote_arg(arg: str) -> str:
    """Quote one script argument for ``sh -c``; ``$$`` doubled so macros keep it literal."""
    return shlex.quote(arg).replace("$$", "$$$$")


def _entry_name(script: str | None, m: str | None) -> str:
    """The script's file name without its extension, or the module's last part."""
    if script is not None:
        return os.path.splitext(os.path.basename(script.rstrip("/")))[0]
    return str(m).rsplit(".", 1)[-1]


def split_name(name: str, script: str | None, m: str | None) -> tuple[str, str]:
    """``--name`` -> (experiment, run), TorchX's rules: ``EXP/RUN``, ``EXP/``, ``/RUN`` or
    ``RUN`` (no ``/``: all of it is the run). The first ``/`` splits; a missing run is the
    script or module name, a missing experiment ``default-experiment``."""
    experiment, slash, run = name.partition("/")
    if not slash:
        experiment, run = "", name
    return experiment or DEFAULT_EXPERIMENT, run or _sanitize(_entry_name(script, m))


def _sanitize(text: str) -> str:
    """A valid role/app name: letters, digits, '_', '.', '-', starting with a letter/digit."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text).lstrip("_.-")
    return cleaned or "app"
