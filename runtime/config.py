"""What one agent runs: ``LaunchConfig`` (the typed form of torchrun's flags) and the worker env.

Both the command line (``python -m xrun.runtime``) and the library call
(``xrun.runtime.launch``) build a ``LaunchConfig`` and hand it to the same ``Agent``; the
environment every worker sees is computed by ``worker_env`` (from a ``WorkerGroup``) alone, so
the two paths cannot drift.

Standard library only: this module is on the agent's start-up path.
"""

from __future__ import annotations

import os
import signal
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xrun
from xrun.contract import (
    JOB_ID_ENV,
    MAX_NODES,
    MAX_NPROC_PER_NODE,
    RDZV_BACKENDS,
    RDZV_ROUND_ENV,
    RECOVER_MODES,
)
from xrun.errors import UsageError
from xrun.limits import check_count, check_duration
from xrun.record import Value

from .rendezvous.conf import parse_rdzv_conf
from .rendezvous.endpoint import Endpoint

if TYPE_CHECKING:
    from .workers.streams import Std

DEFAULT_ROLE = "default"
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
# torchrun's default tee/redirect console prefix; overridable by this env var (same as torchrun).
LOG_PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
DEFAULT_LOG_PREFIX_TEMPLATE = "[${role_name}${local_rank}]:"
# Variable name used in script arguments, replaced by each worker's local rank (torchrun's macro;
# ``$local_rank`` works too and ``$$`` is a literal ``$``, as in torchrun's string.Template).
LOCAL_RANK_MACRO = "${local_rank}"
# the rendezvous backends whose agents can stand by as spares (runtime/rendezvous/spares.py,
# etcd_spares.py): not static (a fixed node rank each), not standalone (one node)
SPARE_BACKENDS = ("c10d", "etcd", "etcd-v2")


@dataclass
class LaunchConfig:
    """One agent's job: how many nodes and workers, how they meet, and what to do on failure.

    Mirrors torchrun's flags (``--nnodes MIN:MAX`` -> ``min_nodes``/``max_nodes`` ...). Example::

        cfg = LaunchConfig(nproc_per_node=2)                  # standalone, 1 node x 2 workers
        cfg = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=4,
                           rdzv_endpoint="node0:29400", run_id="job7")
    """

    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    # Empty run_id / endpoint on a single node means "standalone": a private store on a free
    # localhost port and a random run id (what torchrun does for --standalone).
    run_id: str = ""
    role: str = DEFAULT_ROLE
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = ""
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    # The agent is event driven (pidfds, rendezvous fd, signal fd); this is only the period of the
    # fallback poll used when the platform gives no exit fd for a worker.
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_dir: str | None = None
    redirects: Std | Mapping[int, Std] = 0  # type: ignore[assignment]  # Std.NONE, without importing workers
    tee: Std | Mapping[int, Std] = 0  # type: ignore[assignment]
    local_ranks_filter: set[int] | None = None
    node_rank: int = -1  # static backend only
    local_addr: str | None = None
    shutdown_timeout: float = 30.0
    # xrun's stall watchdog (runtime/diagnose): seconds without progress before the attempt
    # ends with the ranks' stacks as its root cause; 0: off. ``stall_silent_timeout``: how long
    # busy but silent workers (or ones not started yet) may go on; 0: max(10 x it, 600 s).
    stall_timeout: float = 0.0
    stall_silent_timeout: float = 0.0
    signals_to_handle: str = DEFAULT_SIGNALS
    log_line_prefix_template: str | None = None
    # torch's LaunchConfig fields, same names and meaning. ``logs_specs`` (a LogsSpecs) replaces
    # log_dir/redirects/tee/local_ranks_filter; ``rdzv_configs`` is merged into rdzv_conf (its
    # ``rank`` is the static rendezvous' node rank, ``timeout`` its join timeout, as
    # ``rdzv_timeout``); ``metrics_cfg`` is accepted and unused (xrun has no torch metrics).
    logs_specs: Any = None
    rdzv_configs: Mapping[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1
    metrics_cfg: Mapping[str, str] = field(default_factory=dict)
    event_log_handler: str = "null"
    numa_options: Any = None
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    # xrun: how a failed attempt's workers are replaced ("off" or "warm", see RECOVER_MODES and
    # docs/recovery.md); ``warm_pool_size``: the warm interpreters kept (0: nproc_per_node).
    recover: str = "off"
    warm_pool_size: int = 0
    # xrun: spare agents beside the job's max_nodes (c10d or etcd; rendezvous/spares.py)
    spares: int = 0
    # rdzv_endpoint parsed (None: standalone), by __post_init__ unless the command line, which
    # parsed it already, passes it: what the agent reads, never the text.
    endpoint: Endpoint | None = None

    def __post_init__(self) -> None:
        if self.endpoint is None and self.rdzv_endpoint:
            self.endpoint = Endpoint.parse(self.rdzv_endpoint)
        _merge_torch_fields(self)
        validate(self)

    @property
    def standalone(self) -> bool:
        return not self.rdzv_endpoint


def _merge_torch_fields(cfg: LaunchConfig) -> None:
    """Fold torch's spellings into xrun's fields; a multi-node config without a run id gets a
    random one, as torch's ``launch_agent`` makes."""
    conf = {k: str(v) for k, v in cfg.rdzv_configs.items() if k != "rank"}
    if "rank" in cfg.rdzv_configs and cfg.node_rank < 0:
        cfg.node_rank = int(cfg.rdzv_configs["rank"])
    if cfg.rdzv_timeout != -1:
        conf["timeout"] = str(cfg.rdzv_timeout)
    if conf:
        merged = {**cfg.rdzv_conf, **conf}
        parse_rdzv_conf(",".join(f"{k}={v}" for k, v in merged.items()))  # check each key
        cfg.rdzv_conf = merged
    if not cfg.run_id and not cfg.standalone:
        cfg.run_id = str(int.from_bytes(os.urandom(16), "big"))  # torch: uuid4().int


def validate(cfg: LaunchConfig) -> None:
    """Reject a config no agent could run, naming the field, its value and the fix."""
    if not 0 < cfg.min_nodes <= cfg.max_nodes:
        raise UsageError(
            f"nnodes {cfg.min_nodes}:{cfg.max_nodes} is invalid: expected 0 < MIN <= MAX "
            "(e.g. --nnodes 2 or --nnodes 1:4)"
        )
    # The documented bounds (xrun.contract): every node and worker costs the agent a loop
    # iteration, a directory or a process, so an absurd count is refused before any of them.
    check_count(cfg.max_nodes, "nnodes", MAX_NODES)
    check_count(cfg.nproc_per_node, "nproc_per_node", MAX_NPROC_PER_NODE)
    if cfg.max_restarts < 0:
        raise UsageError(f"max_restarts {cfg.max_restarts} is invalid: expected an integer >= 0")
    if cfg.rdzv_backend not in RDZV_BACKENDS:
        raise UsageError(
            f"rdzv backend {cfg.rdzv_backend!r} is not supported: expected "
            f"{' or '.join(map(repr, RDZV_BACKENDS))}"
        )
    if cfg.rdzv_backend == "static":
        if cfg.min_nodes != cfg.max_nodes:
            raise UsageError(
                f"nnodes {cfg.min_nodes}:{cfg.max_nodes} is elastic but the static rendezvous "
                "needs a fixed size: use --nnodes N or --rdzv-backend c10d"
            )
        if not 0 <= cfg.node_rank < cfg.max_nodes:
            raise UsageError(
                f"node_rank {cfg.node_rank} is invalid for the static rendezvous with "
                f"{cfg.max_nodes} node(s): pass --node-rank 0..{cfg.max_nodes - 1}"
            )
        if not cfg.rdzv_endpoint:
            raise UsageError(
                "the static rendezvous needs an endpoint: pass --master-addr/--master-port "
                "or --rdzv-endpoint host:port"
            )
    if cfg.standalone and cfg.max_nodes > 1:
        raise UsageError(
            f"nnodes {cfg.min_nodes}:{cfg.max_nodes} needs a rendezvous every node can reach: "
            "pass --rdzv-endpoint host:port (and the same --rdzv-id on every node)"
        )
    if cfg.start_method not in ("spawn", "fork", "forkserver"):
        raise UsageError(
            f"start_method {cfg.start_method!r} is invalid: expected spawn, fork or forkserver"
        )
    check_duration(cfg.shutdown_timeout, "shutdown_timeout")
    check_duration(cfg.monitor_interval, "monitor_interval")
    for name in ("stall_timeout", "stall_silent_timeout"):
        value = check_duration(getattr(cfg, name), name)
        if 0 < value < 1:  # a sub-second watchdog kills healthy jobs (or underflows to off)
            raise UsageError(
                f"{name}={value!r} is invalid: expected 0 (off) or a number of seconds from 1"
            )
    if cfg.monitor_interval <= 0:
        raise UsageError(
            f"monitor_interval {cfg.monitor_interval} is invalid: expected a number of seconds > 0"
        )
    if cfg.recover not in RECOVER_MODES:
        raise UsageError(
            f"recover {cfg.recover!r} is invalid: expected {' or '.join(RECOVER_MODES)}"
        )
    check_count(cfg.warm_pool_size, "warm_pool_size", MAX_NPROC_PER_NODE, lo=0)
    check_count(cfg.spares, "spares", MAX_NODES, lo=0)
    if cfg.spares and (cfg.rdzv_backend not in SPARE_BACKENDS or cfg.standalone):
        raise UsageError(
            f"spares {cfg.spares} needs the c10d or etcd rendezvous on a shared --rdzv-endpoint "
            f"(got backend {cfg.rdzv_backend!r}{', standalone' if cfg.standalone else ''}); drop "
            f"it or use --rdzv-backend c10d --rdzv-endpoint HOST:PORT"
        )
    parse_signals(cfg.signals_to_handle)


def parse_signals(spec: str) -> tuple[signal.Signals, ...]:
    """``"SIGTERM,SIGUSR2"`` -> the signals; an unknown name is a UsageError listing the form."""
    out: list[signal.Signals] = []
    for name in (s.strip() for s in spec.split(",")):
        if not name:
            continue
        sig = getattr(signal.Signals, name.upper(), None)
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(
                f"signal {name!r} in --signals-to-handle cannot be handled: expected "
                "comma-separated catchable signal names such as SIGTERM,SIGINT,SIGUSR2"
            )
        out.append(sig)
    return tuple(dict.fromkeys(out))


def log_line_prefix(template: str | None, role: str, local_rank: int, rank: int) -> str:
    """The console prefix of a tee'd line: ``[default0]:`` unless the template env var says else."""
    return string.Template(template or DEFAULT_LOG_PREFIX_TEMPLATE).safe_substitute(
        role_name=role, local_rank=local_rank, rank=rank
    )


def substitute_local_rank(args: tuple[object, ...], local_rank: int) -> tuple[object, ...]:
    """Replace ``${local_rank}``/``$local_rank`` inside string arguments and ``$$`` by ``$``
    (torchrun's macro, a ``string.Template``), leave others as is."""
    return tuple(
        string.Template(a).safe_substitute(local_rank=local_rank) if isinstance(a, str) else a
        for a in args
    )


class WorkerGroup(Value):
    """One start of this node's workers, placed by the rendezvous round: everything a worker's
    environment is computed from, save its local rank and error file. A plain value class: a
    dataclass costs every agent's start-up (benchmark 1) ~1.6 ms to make."""

    role: str
    run_id: str
    local_world_size: int  # workers on this node
    rank_offset: int  # global rank of this node's local rank 0
    world_size: int
    group_rank: int  # this node's rank among the nodes
    group_world_size: int
    master_addr: str  # the job's store (the agent's, torch's protocol on the rendezvous port)
    master_port: int
    restart_count: int  # failure restarts used so far
    max_restarts: int
    rdzv_round: int = 0  # the rendezvous round this start belongs to (RDZV_ROUND_ENV)


def worker_env(
    group: WorkerGroup,
    local_rank: int,
    error_file: str,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables one worker gets on top of the agent's environment (torchrun's contract).

    The only function that computes them: the CLI agent and ``launch`` both call it.
    ``environ`` is the agent's environment (default ``os.environ``), read for the variables whose
    user-set value wins (TORCH_NCCL_ASYNC_ERROR_HANDLING, OMP_NUM_THREADS).
    """
    env = os.environ if environ is None else environ
    rank = group.rank_offset + local_rank
    out = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(group.group_rank),
        # One role per agent: role ranks are the global ranks (as in torchrun with one role).
        "ROLE_RANK": str(rank),
        "ROLE_NAME": group.role,
        "LOCAL_WORLD_SIZE": str(group.local_world_size),
        "WORLD_SIZE": str(group.world_size),
        "GROUP_WORLD_SIZE": str(group.group_world_size),
        "ROLE_WORLD_SIZE": str(group.world_size),
        "MASTER_ADDR": group.master_addr,
        "MASTER_PORT": str(group.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(group.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(group.max_restarts),
        "TORCHELASTIC_RUN_ID": group.run_id,
        # The agent's store speaks torch's TCPStore protocol at MASTER_ADDR:MASTER_PORT, and
        # listens before any worker starts: every rank is a client of it (as under torchrun).
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # Each worker's own error file (under the agent's log dir), never the agent's.
        "TORCHELASTIC_ERROR_FILE": error_file,
        RDZV_ROUND_ENV: str(group.rdzv_round),
    }
    shim = torchx_shim_path(env)
    if shim:
        out["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), shim) if p)
    if "OMP_NUM_THREADS" in env:
        out["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"]
    elif group.local_world_size > 1:
        # torchrun's default: N workers each spawning one OpenMP thread per core overload a node.
        out["OMP_NUM_THREADS"] = "1"
    return out


_TORCHX_FOUND: list[bool] = []  # find_spec's answer, asked once per agent


def torchx_shim_path(env: Mapping[str, str]) -> str | None:
    """The folder with xrun's ``torchx.tracker`` stand-in (xrun/torchx/shim), for the
    workers of a job xrun started (``TORCHX_JOB_ID`` set) when no real TorchX is importable:
    a TorchX script's ``from torchx.tracker import app_run_from_env`` then works unchanged.
    Appended to ``PYTHONPATH``, after anything the user put there."""
    if JOB_ID_ENV not in env:
        return None
    if not _TORCHX_FOUND:
        # benchmark 1: TORCHX_JOB_ID jobs only; xrun-agent's script never loads it
        import importlib.util

        _TORCHX_FOUND.append(importlib.util.find_spec("torchx") is not None)
    if _TORCHX_FOUND[0]:
        return None
    return os.path.join(os.path.dirname(xrun.__file__), "torchx", "shim")


def launch_worker_env(
    cfg: LaunchConfig, local_rank: int, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What torchrun's launcher adds to a worker's env beyond ``worker_env``:
    ``TORCHELASTIC_SIGNALS_TO_HANDLE``, and with ``virtual_local_rank`` ``LOCAL_RANK=0`` plus
    ``CUDA_VISIBLE_DEVICES`` naming the worker's one device (through the agent's own list)."""
    env = os.environ if environ is None else environ
    out = {"TORCHELASTIC_SIGNALS_TO_HANDLE": cfg.signals_to_handle}
    if cfg.virtual_local_rank:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        devices = [d.strip() for d in visible.split(",")] if visible is not None else None
        if devices is not None and local_rank >= len(devices):
            raise UsageError(
                f"--virtual-local-rank: local rank {local_rank} has no device in "
                f"CUDA_VISIBLE_DEVICES={visible!r}: list one device per worker or lower "
                "--nproc-per-node"
            )
        out["LOCAL_RANK"] = "0"
        out["CUDA_VISIBLE_DEVICES"] = (
            devices[local_rank] if devices is not None else str(local_rank)
        )
    return out


def random_uuid() -> str:
    """``str(uuid.uuid4())``, without importing ``uuid`` (it imports ``platform``: milliseconds
    of every standalone agent's start-up): a run id when none is given."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
