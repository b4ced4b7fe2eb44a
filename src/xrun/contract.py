"""What the launching side (components, schedulers) and a replica's runtime must agree on.

The names and numbers here cross a process boundary: a component writes them into a command
line, a scheduler exports them into a replica's environment, and the runtime agent inside the
replica reads them. Each has exactly one owner, this module, so the two sides cannot drift.

Standard library only and nothing imported: the agent, the CLI and every scheduler import it.
"""

from __future__ import annotations

# The rendezvous backends the runtime implements (torchrun's names).
RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
# The ones kept in an etcd the cluster runs (torchrun's two names, one implementation), and
# etcd's client port: torchrun's default for an etcd ``--rdzv-endpoint HOST``.
ETCD_BACKENDS = ("etcd", "etcd-v2")
ETCD_DEFAULT_PORT = 2379

# torchrun's port for an ``--rdzv-endpoint HOST`` given without one (c10d rendezvous).
RDZV_ENDPOINT_DEFAULT_PORT = 29400
# torchrun's ``--master-port`` default (static rendezvous), and TorchX's ``dist.ddp`` default
# ``rdzv_port``: the port on the first replica that the components' rendezvous endpoint uses.
MASTER_PORT_DEFAULT = 29500

# The job's rendezvous secret: a scheduler makes one per job and exports it as the first
# variable (or a file named by the second); never a command line, and the agent keeps both out
# of its workers' environment (``AGENT_ONLY_ENV``, below).
TOKEN_ENV = "XRUN_RDZV_TOKEN"
TOKEN_FILE_ENV = "XRUN_RDZV_TOKEN_FILE"

# A free rendezvous port a scheduler picked for a multi-replica role (local_cwd, where every
# replica shares one host); the components' default endpoint defers to it.
RDZV_PORT_ENV = "XRUN_RDZV_PORT"

# The host of the role's first replica. ``${rank0_env}`` in a role's args or env becomes this
# *name* (see ``specs.macros``), and every replica's environment sets it.
RANK0_HOST_ENV = "XRUN_RANK0_HOST"
# TorchX's name for the same host (its schedulers set it in every replica; gap N17): scripts and
# components written for TorchX read it.
TORCHX_RANK0_HOST_ENV = "TORCHX_RANK0_HOST"

# A role's metadata key (value True) set by the dist components: the runtime agent in each of
# its replicas restarts the workers in place, up to the role's ``max_retries``
# (``--max-restarts``). A scheduler therefore does not run a failed replica of such a role
# again (that would make (N+1)^2 attempts); it only brings the job back after a preemption.
# A role without it (utils.*, a torchrun command) is re-run by the scheduler, as in TorchX.
RESTARTS_IN_PLACE = "xrun.restarts_in_place"
# A role's metadata key set by the dist components and utils.python to their ``--script`` (as
# given: relative to the job's working dir). Each scheduler checks at submit that the file is
# where the job runs (local_cwd: the cwd; docker: the workspace built into the image; slurm:
# the workspace or its job_dir copy) instead of letting the app fail on it.
SCRIPT = "xrun.script"
# A role's metadata key set by dist.ddp to its ``--spares`` S (only when S > 0): S of the role's
# replicas are spare nodes, so a scheduler that allocates a node range (slurm) asks for the
# spares on top of the floor: ``min_replicas + S`` nodes at least.
SPARES = "xrun.spares"

# The most restarts (``max_retries``, the agent's ``--max-restarts``) a role may ask for: far
# above any real job; refused at submit, not by the agent inside the job.
MAX_RESTARTS = 2**31 - 1

# Where a replica's runtime agent keeps its workers' per-attempt logs: torchrun's env default
# for ``--log-dir``. The schedulers set it to a dir under the app's own logs, so an agent
# never falls back to a temporary dir that outlives the job.
AGENT_LOG_DIR_ENV = "PET_LOG_DIR"

# The agent's extra stop signals beside SIGTERM, as torchrun's env default for
# ``--signals-to-handle`` (the runtime reads every flag's default from ``PET_<FLAG>``): Slurm's
# batch script adds the ``--signal`` warning's to it.
AGENT_SIGNALS_ENV = "PET_SIGNALS_TO_HANDLE"

# The file a worker touches to tell its agent's stall watchdog it made progress
# (``xrun.runtime.diagnose.beat.beat()``); the agent sets it per worker when a stall timeout is on.
BEAT_FILE_ENV = "XRUN_BEAT_FILE"
# The rendezvous round a worker group was started in (xrun's addition to torchrun's worker
# env): the same number in every worker of one start of the job, membership restarts counted
# too, where TORCHELASTIC_RESTART_COUNT is each agent's own failure count. The tracker keys a
# job's attempts by it (xrun.tracker.attempts).
RDZV_ROUND_ENV = "XRUN_ROUND"
# The agent's --recover (dist.ddp's recover): "off", torchrun's cold restart, or "warm", a
# restarted rank taken from the agent's pool of pre-started interpreters (docs/recovery.md).
RECOVER_MODES = ("off", "warm")

# Sweeps (``xrun run --sweep``): every worker of trial i gets its values as
# ``XRUN_SWEEP_<NAME>`` (the parameter's name upper-cased), its index and the sweep's size.
SWEEP_ENV_PREFIX = "XRUN_SWEEP_"
TRIAL_INDEX_ENV = "XRUN_TRIAL_INDEX"
SWEEP_SIZE_ENV = "XRUN_SWEEP_SIZE"

# The documented upper bounds of a job's size, checked wherever a size enters: the ``-j``
# grammar, AppDef validation (``num_replicas``) and the runtime's flags (``--nnodes``,
# ``--nproc-per-node``) and ``LaunchConfig``. Far above any real job, and low enough that no
# per-node or per-worker loop (directories, processes, request entries) can run away with an
# absurd number: a bigger value is a usage error (exit 2) that names the limit.
MAX_NODES = 65_536
MAX_NPROC_PER_NODE = 4_096
MAX_REPLICAS = 65_536
# The longest duration any option takes (grace periods, timeouts, rendezvous conf values), in
# seconds: one day. NaN, infinities and longer values are refused where they enter.
MAX_DURATION_S = 86_400.0

# Where a replica's runtime agent writes its exit record (``{"exitcode": N, ...}`` as JSON,
# atomically) when it ends. local_cwd sets it to ``<app dir>/<role>/<i>/exit.json``: after its
# supervisor is killed, ``status`` reads the replicas' own records instead of guessing. Agent
# only: workers never see it (a nested agent must not overwrite its parent's record).
EXIT_RECORD_ENV = "XRUN_EXIT_RECORD"
AGENT_ONLY_ENV = (TOKEN_ENV, TOKEN_FILE_ENV, EXIT_RECORD_ENV)

# A local_cwd app's own directory, in every replica's environment and so in that of every
# process a replica starts (the agent's workers too): with the state dir deleted, ``cancel``
# and ``status`` still find the app's processes by it (``/proc/PID/environ``).
APP_DIR_ENV = "XRUN_APP_DIR"

# Experiment tracking: TorchX 0.7.0's variables, which the runner sets in every role's
# environment and ``xrun.tracker`` reads in the job (``xrun.tracker.submit``), plus xrun's
# stable run id (``<scheduler>_<session>_<app id>``; it also turns the embedded default tracker
# on in a job xrun started). The dist components set the experiment (``--name EXP/RUN``).
JOB_ID_ENV = "TORCHX_JOB_ID"
PARENT_RUN_ID_ENV = "TORCHX_PARENT_RUN_ID"
TRACKERS_ENV = "TORCHX_TRACKERS"
EXPERIMENT_ENV = "TORCHX_TRACKING_EXPERIMENT_NAME"
RUN_ID_ENV = "XRUN_RUN_ID"


def tracker_config_env(name: str) -> str:
    """``TORCHX_TRACKER_<NAME>_CONFIG``: where tracker ``name``'s config travels to the job."""
    return f"TORCHX_TRACKER_{name.upper()}_CONFIG"


# A graceful stop (``xrun.runtime.stop``, ``xrun.runtime.stopping``): the agent names the flag
# dir in every worker's environment. The grace in seconds: how long the agent lets workers that
# watch for stop requests save before it stops them; each scheduler sets it to its own grace
# (local_cwd's stop_grace_s, docker's stop_timeout, Slurm's GraceTime or warning lead). Slurm's
# batch script also names the file the agents note a stop request in (it requeues the job once
# when that file is set).
STOP_DIR_ENV = "XRUN_STOP_DIR"
STOP_GRACE_ENV = "XRUN_STOP_GRACE"
STOP_RECORD_ENV = "XRUN_STOP_RECORD"

# ``xrun stacks``: each agent holds a FIFO of this name open in its run dir (the CLI finds it in
# ``/proc/PID/fd`` and writes to it) and answers with a file of the second name beside it.
STACKS_REQUEST_FIFO = "stacks.request"
STACKS_FILE = "stacks.json"

# A Slurm replica's role and index, exported by the batch script in each task (the stacks
# helper reads them back from an agent's ``/proc/PID/environ`` to name it).
ROLE_ENV = "XRUN_ROLE"
REPLICA_ID_ENV = "XRUN_REPLICA_ID"
# What the runtime's quarantine calls a node (runtime/rendezvous/budget.py): the host name
# unless this is set; local_cwd sets it per replica (its replicas share one host).
NODE_ID_ENV = "XRUN_NODE_ID"

# The runtime agent's last stderr line after a failure: ``<prefix><cause> (rank R, file:line)``.
# docker and slurm keep only a replica's output, so their status reads the cause from it.
ROOT_CAUSE_PREFIX = "xrun-agent: root cause: "

# TorchX's names for xrun's schedulers: a TorchX user's ``-s local_docker``, ``local_docker://``
# handles and ``[local_docker]`` config sections mean xrun's ``docker`` (one engine, one box).
SCHEDULER_ALIASES = {"local_docker": "docker"}
