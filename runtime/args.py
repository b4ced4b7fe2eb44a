"""torchrun's command line, parsed into a ``LaunchConfig`` plus the worker command.

Every torchrun 2.13 flag is accepted in both ``--dash-form`` and ``--underscore_form``, with
torchrun's meaning; a default can also come from ``PET_<NAME>`` (``PET_NNODES``,
``PET_NPROC_PER_NODE`` ...) as with torchrun. Bad values raise ``UsageError`` (a ``ValueError``,
as torchrun's) naming the value and the expected form.

Standard library only (on the agent's start-up path).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from xrun.contract import (
    ETCD_BACKENDS,
    ETCD_DEFAULT_PORT,
    MAX_DURATION_S,
    MAX_NODES,
    MAX_NPROC_PER_NODE,
    MAX_RESTARTS,
    RDZV_BACKENDS,
    RDZV_ENDPOINT_DEFAULT_PORT,
    RECOVER_MODES,
)
from xrun.errors import UsageError
from xrun.limits import capped_int, check_duration, is_digits, shown, to_float
from xrun.noderange import parse_node_range

from .config import DEFAULT_SIGNALS, LaunchConfig

# One parser for --rdzv-conf and one for --rdzv-endpoint, the rendezvous' own: a value the
# rendezvous would reject later (unknown key, is_host=maybe, token_file=, heartbeat_interval >=
# timeout, port 99999) fails here as a one-line usage error, before the agent binds or waits.
from .rendezvous.conf import parse_rdzv_conf
from .rendezvous.endpoint import Endpoint, unbracket
from .workers.streams import Std, to_map

PROG = "xrun-agent"
# torchrun's entry-point group for --logs-specs classes.
LOGS_SPECS_GROUP = "torchrun.logs_specs"
# torchrun's registered event handlers (eventlog.py writes "console"; the others drop events).
EVENT_HANDLERS = ("null", "console", "dynamic_rendezvous")


class NnodesError(UsageError, RuntimeError):
    """A bad --nnodes (torch's parse_min_max_nnodes raises RuntimeError)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as ONE line (``xrun-agent: error: ...``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def comma_list(value: str) -> list[str]:
    """torchrun's filter list: ``"a,b"`` -> ["a", "b"]; ``,,`` is a literal comma."""
    return [item.replace("\0", ",") for item in value.replace(",,", "\0").split(",") if item]


def _env_default(dest: str, default: str | None) -> str | None:
    """torchrun's ``PET_<DEST>`` defaulting: the env var wins over the built-in default."""
    return os.environ.get(f"PET_{dest.upper()}", default)


def _env_flag(dest: str) -> bool:
    raw = os.environ.get(f"PET_{dest.upper()}", "0")
    try:
        return bool(int(raw))
    except ValueError:
        raise UsageError(f"PET_{dest.upper()}={raw!r} is invalid: expected 0 or 1") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="xrun's elastic agent: a torch-free, torchrun-compatible launcher. "
        "Every option also reads its default from PET_<OPTION> (e.g. PET_NPROC_PER_NODE).",
    )

    def opt(*names: str, default: str | None, help: str, **kw: Any) -> None:
        dest = names[-1].lstrip("-").replace("-", "_")
        p.add_argument(*names, dest=dest, default=_env_default(dest, default), help=help, **kw)

    def flag(*names: str, help: str) -> None:
        dest = max(names, key=len).lstrip("-").replace("-", "_")
        p.add_argument(*names, dest=dest, action="store_true", default=_env_flag(dest), help=help)

    def both(name: str) -> tuple[str, str]:
        return (f"--{name}", f"--{name.replace('-', '_')}")

    opt("--nnodes", default="1:1", help="nodes: N or MIN:MAX (elastic). Default 1:1.")
    opt(*both("nproc-per-node"), default="1", help="workers per node: int, auto, cpu or gpu.")
    opt(
        *both("rdzv-backend"),
        default="static",
        help="c10d, static, etcd or etcd-v2 (torchrun's default "
        "static on one node without --master-port means standalone; etcd: --rdzv-endpoint is "
        "etcd's HOST[:2379]).",
    )
    opt(
        *both("rdzv-endpoint"),
        default="",
        help=f"rendezvous host[:port] ([v6]:port); default port {RDZV_ENDPOINT_DEFAULT_PORT}.",
    )
    opt(*both("rdzv-id"), default="none", help="job id shared by every node.")
    opt(*both("rdzv-conf"), default="", help="k=v,... e.g. join_timeout=600,last_call_timeout=30.")
    flag("--standalone", help="single node: private rendezvous on a free localhost port.")
    opt(*both("max-restarts"), default="0", help="worker group restarts before failing.")
    opt(
        *both("monitor-interval"),
        default="0.1",
        help="fallback poll period in seconds (the "
        "agent is woken by worker exits; this only matters without pidfd support).",
    )
    opt(*both("start-method"), default="spawn", help="spawn, fork or forkserver (--run-path).")
    opt("--role", default="default", help="worker role name (ROLE_NAME).")
    flag("-m", "--module", help="run the script as a module (python -m).")
    flag(*both("no-python"), help="execute the script directly, without python.")
    flag(*both("run-path"), help="run the script with runpy.run_path in a worker process.")
    opt(*both("log-dir"), default=None, help="logs: <log_dir>/<run_id>/attempt_<n>/<local_rank>/.")
    opt("-r", "--redirects", default="0", help="std streams to files only: 0-3 or 0:1,1:2.")
    opt("-t", "--tee", default="0", help="std streams to files and console: 0-3 or 0:1,1:2.")
    opt(
        *both("local-ranks-filter"),
        default="",
        help="console output only from these local ranks, e.g. 0,1 (log files get everything).",
    )
    opt(*both("node-rank"), default="0", help="this node's rank (static rendezvous only).")
    opt(*both("master-addr"), default="127.0.0.1", help="static rendezvous host.")
    opt(*both("master-port"), default=None, help="static rendezvous port (default 29500).")
    opt(*both("local-addr"), default=None, help="address this node advertises to its peers.")
    opt(
        *both("signals-to-handle"),
        default=DEFAULT_SIGNALS,
        help="signals forwarded to the "
        "workers before the agent shuts down, e.g. SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2.",
    )
    opt(
        *both("shutdown-timeout"),
        default=None,
        help="seconds between the forwarded signal "
        "and SIGKILL (default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30).",
    )
    opt(
        *both("stall-timeout"),
        default="0",
        help="xrun: end an attempt when no worker made progress (a line, a write, a beat, "
        "a file timer request) nor did any work (CPU, reads) for this many seconds (1 or "
        "more), with every rank's stack as its root cause (needs py-spy; docs/diagnose.md); "
        "0: off.",
    )
    opt(
        *both("stall-silent-timeout"),
        default="0",
        help="xrun: with --stall-timeout, how long the workers may stay silent (no line, "
        "write, beat nor timer request) while busy or before their first sign of life "
        "(default 0: max(10 x --stall-timeout, 600 s)).",
    )
    opt(
        "--recover",
        default="off",
        help="xrun: how a failed attempt's workers are replaced: off (cold interpreters, as "
        "torchrun) or warm (pre-started interpreters that imported what the workers import; "
        "docs/recovery.md).",
    )
    opt(
        *both("warm-pool-size"),
        default="0",
        help="xrun: with --recover warm, the warm interpreters each agent keeps (default 0: "
        "--nproc-per-node).",
    )
    opt(
        "--spares",
        default="0",
        help="xrun: spare agents the job has beside its --nnodes (c10d or etcd): an agent that "
        "arrives when the world is full stands by and takes the slot (node rank, RANKs) of a "
        "node that is lost (docs/runtime.md).",
    )
    opt(
        *both("event-log-handler"),
        default="null",
        help="where torchrun's event records go: null, console (JSON lines on stderr).",
    )
    for stream in ("stdout", "stderr"):
        opt(
            *both(f"duplicate-{stream}-filters"),
            default="",
            help=f"tee'd {stream} lines holding any of these comma-separated strings also go "
            f"to <attempt dir>/filtered_{stream}.log (,, is a literal comma).",
        )
    p.add_argument(
        *both("logs-specs"),
        dest="logs_specs",
        default=None,
        help=f"a LogsSpecs class from the {LOGS_SPECS_GROUP!r} entry-point group "
        "(default: xrun's layout under --log-dir).",
    )
    p.add_argument(
        *both("numa-binding"),
        dest="numa_binding",
        default=None,
        help="bind each worker to the CPUs near its GPU: node, socket, exclusive or core-complex.",
    )
    flag(
        *both("virtual-local-rank"),
        help="LOCAL_RANK=0 for every worker and CUDA_VISIBLE_DEVICES naming its one GPU.",
    )
    p.add_argument("training_script", help="script (or module with -m, binary with --no-python)")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


# A count flag (--max-restarts, --node-rank, --master-port) past this is a typo, not a plan;
# past Python's int-string limit int() would raise instead of saying so.
_MAX_INT_FLAG = MAX_RESTARTS


def _int(flag: str, raw: str, lo: int = 0) -> int:
    text = str(raw).strip()
    v = capped_int(text, _MAX_INT_FLAG) if is_digits(text) else lo - 1
    if v < lo or v > _MAX_INT_FLAG:
        raise UsageError(
            f"{flag} {shown(raw)} is invalid: expected an integer from {lo} to {_MAX_INT_FLAG:,}"
        )
    return v


def _stall(flag: str, raw: str) -> float:
    """A watchdog's limit: 0 (off/default) or whole seconds' worth from 1 s to a day. A
    sub-second one (``0.001``, a denormal ``5e-324`` whose period underflows to 0) would
    kill healthy jobs or silently switch the watchdog off."""
    value = 0.0
    try:
        value = _float(flag, raw)
    except UsageError:
        value = -1.0
    if value == 0 or 1 <= value:
        return value
    raise UsageError(
        f"{flag} {shown(raw)} is invalid: expected 0 (off) or a number of seconds from 1 to "
        f"{MAX_DURATION_S:g} (one day)"
    )


def _float(flag: str, raw: str) -> float:
    """A duration flag: seconds from 0 to a day (NaN, infinities and absurd values refused)."""
    try:  # to_float: NaN for other scripts' digits ('٢'), ASCII only as everywhere
        return check_duration(to_float(str(raw)[:100]), flag)
    except (TypeError, ValueError, UsageError):  # named as given: 'soon', not nan
        raise UsageError(
            f"{flag} {shown(raw)} is invalid: expected a number of seconds from 0 to "
            f"{MAX_DURATION_S:g} (one day)"
        ) from None


def parse_nnodes(raw: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4) (torch's ``parse_min_max_nnodes``): the
    ``[MIN:]N`` grammar of ``xrun.noderange``, with spaces around a part allowed (torch reads
    each part with int())."""
    nodes = parse_node_range(":".join(p.strip() for p in raw.split(":")))
    lo, hi = (nodes.min, nodes.max) if nodes is not None else (0, -1)
    if not 0 < lo <= hi:
        raise NnodesError(
            f"--nnodes {shown(raw)} is invalid: expected N or MIN:MAX with 0 < MIN <= MAX "
            "(e.g. --nnodes 2 or --nnodes 1:4)"
        )
    if hi > MAX_NODES:
        raise NnodesError(
            f"--nnodes {shown(raw)} is over the limit of {MAX_NODES:,} nodes; "
            f"ask for at most {MAX_NODES:,}"
        )
    return lo, hi


def count_gpus() -> int:
    """NVIDIA GPUs on this host, without importing torch (driver procfs, else nvidia-smi -L)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_nproc(raw: str) -> int:
    """``--nproc-per-node``: 1 to MAX_NPROC_PER_NODE (4,096; each worker costs the agent a
    process and a log directory), or auto/cpu/gpu."""
    n = capped_int(raw, MAX_NPROC_PER_NODE) if is_digits(raw) else 0
    if n > MAX_NPROC_PER_NODE:
        raise UsageError(
            f"--nproc-per-node {shown(raw)} is over the limit of {MAX_NPROC_PER_NODE:,} "
            f"workers per node; ask for at most {MAX_NPROC_PER_NODE:,}"
        )
    if n > 0:
        return n
    if raw == "cpu":
        return cpu_count()
    if raw in ("gpu", "auto"):
        gpus = count_gpus()
        if gpus:
            return gpus
        if raw == "auto":
            return cpu_count()
        raise UsageError(
            "--nproc-per-node 'gpu' found no GPU (no /proc/driver/nvidia/gpus, no nvidia-smi): "
            "use an integer, 'cpu' or 'auto'"
        )
    raise UsageError(
        f"--nproc-per-node {shown(raw)} is invalid: expected a positive integer (at most "
        f"{MAX_NPROC_PER_NODE:,}), auto, cpu or gpu"
    )


def parse_local_ranks_filter(raw: str, nproc: int) -> set[int] | None:
    if not raw:
        return None
    try:
        ranks = {int(r) for r in raw.split(",")}
    except ValueError:
        ranks = {-1}
    if not ranks or min(ranks) < 0 or max(ranks) >= nproc:
        raise UsageError(
            f"--local-ranks-filter {raw!r} is invalid: expected comma-separated local ranks "
            f"in 0..{nproc - 1}, e.g. 0,1"
        )
    return ranks


def check_numa(mode: str | None, nproc: int) -> str | None:
    """``--numa-binding MODE``, checked against this host now (before any rendezvous)."""
    if mode is None:
        return None
    from .workers.numa import NumaBinding  # benchmark 1: --numa-binding only

    NumaBinding(mode, nproc)
    return mode


def load_logs_specs(  # noqa: PLR0913 - torchrun's LogsSpecs constructor arguments
    name: str | None,
    log_dir: str | None,
    redirects: Any,
    tee: Any,
    ranks_filter: set[int] | None,
    nproc: int,
) -> Any:
    """``--logs-specs NAME``: the class registered as ``NAME`` in torchrun's entry-point group,
    built as torchrun builds it; None (xrun's own layout) without the flag or for ``default``.
    The redirects and tee reach the class as per-rank maps, which torch's ``to_map`` takes."""
    if name is None or name == "default":
        return None
    from importlib import metadata  # benchmark 1: --logs-specs only (tens of ms)

    found = metadata.entry_points(group=LOGS_SPECS_GROUP, name=name)
    if not found:
        raise UsageError(
            f"--logs-specs {name!r}: no entry point {name!r} in group {LOGS_SPECS_GROUP!r}; "
            "register your LogsSpecs class there (or drop the flag)"
        )
    cls = next(iter(found)).load()
    return cls(
        log_dir=log_dir,
        redirects=to_map(redirects, nproc),
        tee=to_map(tee, nproc),
        local_ranks_filter=ranks_filter,
    )


def run_script_path(training_script: str, *training_script_args: str) -> None:
    """``--run-path``: run the script in this (worker) interpreter, as ``python script`` would."""
    import runpy  # benchmark 1: --run-path only; xrun-agent's script never loads runpy

    sys.argv = [training_script, *training_script_args]
    try:
        runpy.run_path(training_script, run_name="__main__")
    except SystemExit as e:  # exit(0) is success, not a failure of the function entrypoint
        if e.code not in (0, None):
            raise


def entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: Sequence[Any]) -> str:
    """What the failure summary calls the job (torch's ``_get_entrypoint_name``): a function's
    name; for the Python interpreter, its first argument that is no option (the script or
    ``-m``'s module); a binary's path; ``""`` for nothing. ``--run-path`` names its script."""
    if entrypoint is run_script_path:
        return str(args[0]) if args else ""
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", entrypoint))
    if isinstance(entrypoint, str):
        if entrypoint in (sys.executable, os.environ.get("PYTHON_EXEC")):
            return next((str(a) for a in args if not str(a).startswith("-")), "")
        return entrypoint
    return ""


def parse(
    argv: Sequence[str] | None = None,
) -> tuple[LaunchConfig, Callable[..., Any] | str, tuple[str, ...]]:
    """Command line -> (config, entrypoint, entrypoint args), with torchrun's defaulting."""
    ns = build_parser().parse_args(argv)
    min_nodes, max_nodes = parse_nnodes(ns.nnodes)
    nproc = parse_nproc(ns.nproc_per_node)
    backend = ns.rdzv_backend
    endpoint = ns.rdzv_endpoint
    run_id = ns.rdzv_id
    if backend not in RDZV_BACKENDS:
        raise UsageError(
            f"--rdzv-backend {backend!r} is not supported: expected {' or '.join(RDZV_BACKENDS)}"
        )
    if (
        ns.standalone
        or (backend == "static" and not endpoint and ns.master_port is None and max_nodes == 1)
        or (backend == "c10d" and not endpoint and max_nodes == 1)
    ):
        # torchrun: a one-node job without a master port gets a private store on a free port
        # (the Agent gives it a random run id).
        backend, endpoint, run_id = "c10d", "", ""
    if backend in ETCD_BACKENDS and not endpoint:
        endpoint = f"localhost:{ETCD_DEFAULT_PORT}"  # torchrun's: an etcd on this host
    node_rank = -1
    if backend == "static":
        master_port = _int("--master-port", ns.master_port or "29500")
        if not endpoint:
            endpoint = str(Endpoint(unbracket(ns.master_addr), master_port))
        node_rank = _int("--node-rank", ns.node_rank)
    parsed = None
    if endpoint:
        try:
            # etcd's client port by default, as torchrun (host alone: HOST:2379)
            default = ETCD_DEFAULT_PORT if backend in ETCD_BACKENDS else RDZV_ENDPOINT_DEFAULT_PORT
            parsed = Endpoint.parse(endpoint, default)
        except UsageError as e:
            raise UsageError(f"--rdzv-endpoint: {e}") from None
    if ns.shutdown_timeout is None:
        ns.shutdown_timeout = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    try:
        redirects = Std.parse(ns.redirects, nproc)
        tee = Std.parse(ns.tee, nproc)
    except UsageError as e:
        raise UsageError(f"-r/--redirects or -t/--tee: {e}") from None
    ranks_filter = parse_local_ranks_filter(ns.local_ranks_filter, nproc)
    if ns.event_log_handler not in EVENT_HANDLERS:
        raise UsageError(
            f"--event-log-handler {ns.event_log_handler!r} is not a registered handler: "
            f"expected {', '.join(EVENT_HANDLERS)}"
        )

    if ns.recover not in RECOVER_MODES:
        raise UsageError(
            f"--recover {shown(ns.recover)} is invalid: expected {' or '.join(RECOVER_MODES)}"
        )
    cfg = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        run_id=run_id,
        role=ns.role,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        endpoint=parsed,
        rdzv_conf=parse_rdzv_conf(ns.rdzv_conf),
        max_restarts=_int("--max-restarts", ns.max_restarts),
        monitor_interval=_float("--monitor-interval", ns.monitor_interval) or 0.1,
        start_method=ns.start_method,
        log_dir=ns.log_dir,
        redirects=redirects,
        tee=tee,
        local_ranks_filter=ranks_filter,
        node_rank=node_rank,
        local_addr=ns.local_addr,
        shutdown_timeout=_float("--shutdown-timeout", ns.shutdown_timeout),
        stall_timeout=_stall("--stall-timeout", ns.stall_timeout),
        stall_silent_timeout=_stall("--stall-silent-timeout", ns.stall_silent_timeout),
        signals_to_handle=ns.signals_to_handle,
        log_line_prefix_template=os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        logs_specs=load_logs_specs(ns.logs_specs, ns.log_dir, redirects, tee, ranks_filter, nproc),
        event_log_handler=ns.event_log_handler,
        numa_options=check_numa(ns.numa_binding, nproc),
        duplicate_stdout_filters=comma_list(ns.duplicate_stdout_filters) or None,
        duplicate_stderr_filters=comma_list(ns.duplicate_stderr_filters) or None,
        virtual_local_rank=ns.virtual_local_rank,
        recover=ns.recover,
        warm_pool_size=_int("--warm-pool-size", ns.warm_pool_size),
        spares=_int("--spares", ns.spares),
    )
    entrypoint: Callable[..., Any] | str
    if ns.run_path:
        entrypoint = run_script_path
        # as typed, as torchrun passes it: the workers run in this cwd, and the script sees
        # the sys.argv[0] its user gave
        args: tuple[str, ...] = (ns.training_script,)
    elif ns.no_python:
        if ns.module:
            raise UsageError(
                "--no-python and -m/--module contradict each other: -m runs a Python module, "
                "--no-python runs a binary; drop one"
            )
        entrypoint, args = ns.training_script, ()
    else:
        # -u: unbuffered worker output, so tee'd lines and logs appear as they are written.
        entrypoint = os.environ.get("PYTHON_EXEC", sys.executable)
        args = ("-u", *(("-m",) if ns.module else ()), ns.training_script)
    return cfg, entrypoint, (*args, *ns.training_script_args)
