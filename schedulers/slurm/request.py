"""An AppDef as ONE sbatch script: the Slurm scheduler's request value, built without side effects.

Layout of a job (``<log_root>`` = ``<chdir>/slurm-logs``, ``<chdir>`` = job_dir or the cwd)::

    <log_root>/slurm-<jobid>.out             the batch shell's own output (srun's messages)
    <log_root>/<jobid>/<role>/<i>.stdout     replica i of role: its stdout (appended on requeue)
    <log_root>/<jobid>/<role>/<i>.stderr     ... its stderr
    <log_root>/<jobid>/<role>/<i>.node       the node it ran on (written at start)
    <log_root>/<jobid>/<role>/<i>.exit       its exit code (written when it ends)
    <log_root>/<jobid>/preempted             one line per preemption signal received
    <log_root>/<jobid>/stop-requests         this attempt's agents' stop requests (runtime/stopping.py)
    <log_root>/<jobid>/requeued              the attempt that asked for a requeue, until the
                                             next one starts (Slurm briefly shows it FAILED)

One role is one homogeneous allocation (``--nodes=N --ntasks-per-node=1``, one srun step,
replica = ``$SLURM_PROCID``). Several roles are a heterogeneous job, one component per role and
one srun with ``:``-separated groups; Slurm 22.05 numbers the tasks of such a step globally and
tells no task its group, so each group's command names its role and subtracts its offset.

Quoting: each role's command is kept in a quoted here-document, so the batch shell expands
nothing in it (the accelerate#2816 trap: ``$SLURM_PROCID`` expanded by the batch shell is 0 on
every node). Each task runs it with ``bash -c``; the macros that depend on the task are the only
unquoted parts (``"${SLURM_JOB_ID}"``, ``"${XRUN_REPLICA_ID}"``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xrun.contract import (
    AGENT_LOG_DIR_ENV,
    AGENT_SIGNALS_ENV,
    NODE_ID_ENV,
    RANK0_HOST_ENV,
    REPLICA_ID_ENV,
    ROLE_ENV,
    SPARES,
    STOP_GRACE_ENV,
    STOP_RECORD_ENV,
    TOKEN_ENV,
)
from xrun.errors import UsageError
from xrun.specs import AppDef, BindMount, Role, macros
from xrun.torchx.shim_dir import role_shim

from ..api import scheduler_retries
from . import losses
from .options import SlurmOptions

if TYPE_CHECKING:
    from ..workspace import Workspace

COMMENT_PREFIX = "xrun:"
LOG_SUBDIR = "slurm-logs"

# Sentinels for the macros whose value is only known inside a task: substituted first, then
# turned into double-quoted variable references after the rest of the word is single-quoted.
_TASK_VARS = {"@@XRUN_APP_ID@@": "SLURM_JOB_ID", "@@XRUN_REPLICA_ID@@": REPLICA_ID_ENV}
# task_env(NAME): any other variable of the task's environment (a sweep trial's values).
_ENV_SENTINEL = "@@XRUN_ENV:"
_SENTINEL_RE = re.compile(
    "(" + "|".join(map(re.escape, _TASK_VARS)) + r"|@@XRUN_ENV:[A-Za-z_][A-Za-z0-9_]*@@)"
)
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ClusterInfo:
    """What the submit side knows of the cluster; decides version-dependent flags.

    ``version`` is ``(major, minor)`` from ``sbatch --version``; ``node_mem_mb`` is the smallest
    RealMemory of the partition's nodes (None: unknown, so ``--mem`` is passed as asked).
    """

    version: tuple[int, int] = (22, 5)
    node_mem_mb: int | None = None


@dataclass(frozen=True)
class ArrayJob:
    """What makes the script a job array's, one sweep trial per array task (see array.py)."""

    spec: str  # the --array value, e.g. 0-5%2
    setup: str  # shell code run before srun: this task's trial values, from its index
    trials: int  # how many


def task_env(name: str) -> str:
    """A word part that :func:`shell_word` turns into ``"${NAME}"``: expanded by the task."""
    return f"{_ENV_SENTINEL}{name}@@"


@dataclass
class SlurmBatchRequest:
    """Everything ``schedule`` needs: the script, the sbatch argv, and where logs will be."""

    app_name: str
    script: str
    sbatch_argv: list[str]
    chdir: str
    log_root: str
    roles: dict[str, int] = field(default_factory=dict)  # role name -> max replicas
    workspace: Workspace | None = None  # copied into chdir (job_dir) before sbatch, when set

    def materialize(self) -> str:
        """What ``--dryrun`` prints: the command, then the whole batch script."""
        head = f"# submit: {shlex.join(self.sbatch_argv)} < script\n"
        if self.workspace:
            head += f"# copy workspace {self.workspace.url} -> {self.chdir} first\n"
            head += f"#   {self.workspace.describe_ignored()}\n"
        return head + self.script


def _squote(text: str) -> str:
    """Like shlex.quote, but ``'\\''`` for a quote: shorter and the usual idiom in scripts."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def shell_word(text: str, img_root: str) -> str:
    """``text`` with macros substituted, as ONE shell word for a task's shell.

    Everything is single-quoted except ``${app_id}``/``${replica_id}``, which become
    ``"${SLURM_JOB_ID}"``/``"${XRUN_REPLICA_ID}"`` so the task expands them (not the batch shell).
    """
    values = macros.Values(
        img_root=img_root,
        app_id="@@XRUN_APP_ID@@",
        replica_id="@@XRUN_REPLICA_ID@@",
        rank0_env=RANK0_HOST_ENV,
    )
    out = []
    for part in _SENTINEL_RE.split(values.substitute(text)):
        if part in _TASK_VARS:
            out.append(f'"${{{_TASK_VARS[part]}}}"')
        elif part.startswith(_ENV_SENTINEL) and part.endswith("@@"):
            out.append(f'"${{{part[len(_ENV_SENTINEL) : -2]}}}"')
        elif part:
            out.append(_squote(part))
    return "".join(out) or "''"


def _check_role(role: Role) -> None:
    for name in role.env:
        if not _ENV_NAME_RE.fullmatch(name):
            raise UsageError(
                f"role {role.name!r}: env name {name!r} is not a shell variable name; "
                "use letters, digits and '_' (not starting with a digit)"
            )
    for m in role.mounts:
        # Slurm runs on the nodes' own filesystem: there is nothing to mount, only a path that
        # is already where the job expects it.
        if not (isinstance(m, BindMount) and m.src_path == m.dst_path):
            raise UsageError(
                f"role {role.name!r}: mount {m} cannot be honoured by slurm (tasks see the "
                "nodes' shared filesystem as is); use the path directly, or a bind mount "
                "whose src equals its dst"
            )


def _role_sbatch_opts(role: Role, options: SlurmOptions, info: ClusterInfo) -> list[str]:
    """The ``#SBATCH`` options of one role's allocation (one het component)."""
    opts: list[str] = []
    lo = role.min_replicas if role.min_replicas is not None else role.num_replicas
    # dist.ddp --spares: the spare nodes come on top of the floor (a job without them has none)
    lo = min(max(lo, 1) + int(role.metadata.get(SPARES, 0)), role.num_replicas)
    elastic = lo < role.num_replicas
    if elastic:
        # No --ntasks-per-node here: with it Slurm derives ntasks=MIN and allocates MIN nodes
        # even when MAX are free (22.05, measured); srun then puts one task on each node.
        opts.append(f"--nodes={lo}-{role.num_replicas}")
    else:
        opts += [f"--nodes={role.num_replicas}", "--ntasks-per-node=1"]
    res = role.resource
    if res.cpu > 0:
        opts.append(f"--cpus-per-task={res.cpu}")
    if res.memMB > 0:
        if info.node_mem_mb is not None and info.node_mem_mb <= 1:
            # RealMemory unset (Slurm's default 1 MB): any --mem would be unsatisfiable.
            opts.append("# --mem skipped: the partition's nodes report no RealMemory")
        else:
            opts.append(f"--mem={res.memMB}M")
    if res.gpu > 0:
        if info.version >= (24, 11):
            opts.append(f"--gpus-per-node={res.gpu}")
        elif elastic:
            opts.append(f"--gres=gpu:{res.gpu}")  # per node, without fixing the task count
        else:
            # Before 24.11 the per-node form needs --ntasks alongside --gpus-per-task (23.11).
            opts += [f"--gpus-per-task={res.gpu}", f"--ntasks={lo}"]
    for flag, value in (
        ("--partition", options.partition),
        ("--time", options.time),
        ("--account", options.account),
        ("--qos", options.qos),
        ("--constraint", options.constraint),
    ):
        if value:
            opts.append(f"{flag}={value}")
    if options.exclusive:
        opts.append("--exclusive")
    return opts


_AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def format_comment(app: AppDef, extra: str = "") -> str:
    """``xrun:APP;ROLE=N;ROLE=N[,EXTRA]``: marks the job as xrun's (for ``list``) and tells any
    shell the roles and replica counts, which the log layout needs."""
    roles = "".join(f";{r.name}={r.num_replicas}" for r in app.roles)
    return f"{COMMENT_PREFIX}{app.name}{roles}" + (f",{extra}" if extra else "")


def parse_comment(comment: str) -> tuple[str, dict[str, int]] | None:
    """(app name, roles) from :func:`format_comment`'s text; None for a job not xrun's."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    head = comment[len(COMMENT_PREFIX) :].split(",", 1)[0]
    name, *parts = head.split(";")
    roles: dict[str, int] = {}
    for part in parts:
        role, _, n = part.partition("=")
        if role and n.isdigit():
            roles[role] = int(n)
    return name, roles


def requeue_limits(app: AppDef) -> tuple[int, int]:
    """(after a preemption, after a failure): how often the batch script may requeue the job.

    As TorchX, a job of several roles takes the smallest of their ``max_retries``: no role
    runs more often than it asked for. A failure is requeued only for roles whose retries are
    the scheduler's: dist.* agents restart their workers in place (``--max-restarts``), and
    requeueing on top of that would make (N+1)^2 attempts (see ``api.scheduler_retries``).
    """
    return (
        min(r.max_retries for r in app.roles),
        min(scheduler_retries(r) for r in app.roles),
    )


def _job_sbatch_opts(
    app: AppDef, options: SlurmOptions, log_root: str, chdir: str, array: ArrayJob | None = None
) -> list[str]:
    """Options for the whole job (first component): name, output, requeue (and the array). The
    comment goes on sbatch's command line instead (see :func:`build_request`): it may contain
    spaces."""
    max_retries = requeue_limits(app)[0]
    opts = [
        f"--job-name={options.job_name or app.name}",
        f"--chdir={chdir}",
        f"--output={log_root}/slurm-{'%A_%a' if array else '%j'}.out",
        "--open-mode=append",
    ]
    if array:
        opts.append(f"--array={array.spec}")
    if options.warning:
        # B: the batch shell gets it and passes it on (srun would not see it otherwise).
        opts.append(f"--signal=B:{options.warning.name}@{options.warning.seconds}")
    if losses.may_lose(app):
        opts.append(losses.SBATCH_OPT)  # a lost node leaves the job, the others go on
    if max_retries > 0:
        opts.append("--requeue")
    else:
        opts.append("--no-requeue")
    if options.mail_user:
        opts.append(f"--mail-user={options.mail_user}")
    if options.mail_type:
        opts.append(f"--mail-type={options.mail_type}")
    return opts


def _sbatch_line(opt: str) -> str:
    if opt.startswith("#"):
        return opt
    # #SBATCH lines are not shell: quotes would be kept literally, so spaces are refused.
    if re.search(r"\s", opt):
        raise UsageError(
            f"sbatch option {opt!r} contains whitespace; #SBATCH lines cannot quote it. "
            "Pass a value without spaces"
        )
    return f"#SBATCH {opt}"


def _role_command(role: Role, offset: int, img_root: str) -> str:
    """The code one task runs with ``bash -c``: who am I, the role's env, the command."""
    lines = [
        f"export {ROLE_ENV}={shlex.quote(role.name)}",
        f"export {REPLICA_ID_ENV}=$((SLURM_PROCID - {offset}))",
        # A runtime agent's per-attempt worker logs: beside the replica's own, not in a
        # temporary dir on the node that nobody removes (the role's env may say otherwise).
        f'export {AGENT_LOG_DIR_ENV}="$XRUN_LOG_DIR/${ROLE_ENV}/${REPLICA_ID_ENV}.workers"',
        # The node to the runtime's quarantine: Slurm's name for it (several slurmds may share a
        # host name, as on a test cluster; then a lost node would quarantine all of them).
        f'export {NODE_ID_ENV}="${{SLURMD_NODENAME:-$(hostname)}}"',
    ]
    for k, v in role.env.items():
        lines.append(f"export {k}={shell_word(v, img_root)}")
    shim = role_shim(role.env)
    if shim:  # a TorchX script's `from torchx.tracker import ...` (gap N16); same path on nodes
        lines.append(f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}"{shlex.quote(shim)}')
    argv = [shell_word(role.entrypoint, img_root)] + [shell_word(a, img_root) for a in role.args]
    lines.append("xrun_replica " + " ".join(argv))
    return "\n".join(lines)


_PRELUDE = """\
set -u
# Everything this job writes besides the workers' own files (see schedulers/slurm/request.py).
export XRUN_LOG_DIR={log_dir}
# The first host of the (first role's) allocation: the rendezvous host of multi-node roles.
{rank0_env}=$(scontrol show hostnames "${{SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}}" | head -n1)
export {rank0_env}
export TORCHX_RANK0_HOST=${rank0_env}  # TorchX's name for it
# A per-job secret for the rendezvous store, made at run time so that it is in no file, no
# command line and no `ps` output; srun hands the environment on to every task.
{token_env}=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')
export {token_env}
export PYTHONUNBUFFERED=1
{path_line}mkdir -p {mkdirs}
rm -f "$XRUN_LOG_DIR/requeued"  # this attempt has started (see the end of the script)
# A graceful stop (xrun.runtime.stop): the agents note it here and give their workers the grace
# to save: the partition's GraceTime at a preemption (the tasks get SIGTERM at once, this shell
# nothing), else the warning's lead time.
export {stop_record_env}="$XRUN_LOG_DIR/stop-requests"
rm -f "${stop_record_env}"
{stop_grace_env}=$(scontrol show partition "${{SLURM_JOB_PARTITION%%,*}}" 2>/dev/null | tr ' ' '\n' | sed -n 's/^GraceTime=//p')
[ "${{{stop_grace_env}:-0}}" -gt 0 ] 2>/dev/null || {stop_grace_env}={grace}
export {stop_grace_env}

# Runs one replica: logs and exit code beside each other under $XRUN_LOG_DIR/<role>/<replica>.
# The command runs in the background so that this shell can pass signals on (srun forwards the
# preemption signal here; the runtime agent forwards it to its workers).
# shellcheck disable=SC2317  # run by the tasks (export -f), not by this shell
xrun_replica() {{
    local out="$XRUN_LOG_DIR/${role_env}/${replica_id_env}" child rc
    echo "${{SLURMD_NODENAME:-$(hostname)}}" >"$out.node"
    rm -f "$out.exit"
    # A requeued job's attempts append to the same files: one line marks where each starts.
    if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
        local sep
        sep="==== xrun: attempt ${{SLURM_RESTART_COUNT}} of job ${{SLURM_JOB_ID}} (requeued) on ${{SLURMD_NODENAME:-$(hostname)}} at $(date '+%F %T') ===="
        echo "$sep" >>"$out.stdout"
        echo "$sep" >>"$out.stderr"
    fi
    "$@" >>"$out.stdout" 2>>"$out.stderr" &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null' TERM
    trap 'kill -INT "$child" 2>/dev/null' INT
{replica_trap}    wait "$child"
    rc=$?
    # A trapped signal interrupts `wait`; wait again until the command itself has ended.
    while kill -0 "$child" 2>/dev/null; do
        wait "$child"
        rc=$?
    done
    echo "$rc" >"$out.exit"
    return "$rc"
}}
export -f xrun_replica
"""

_SIGNAL_HANDLER = """\
# The --signal warning (preemption or time limit) reaches this shell: record it, pass it on.
# shellcheck disable=SC2317  # run by the trap
xrun_on_signal() {
    echo "xrun: got SIG$1 (preemption or time limit): passing it to the replicas" >&2
    echo "$(date +%s) $1 restart=${SLURM_RESTART_COUNT:-0}" >>"$XRUN_LOG_DIR/preempted"
    XRUN_PREEMPTED=1
    kill -"$1" "$XRUN_SRUN" 2>/dev/null
}
"""

_EPILOGUE = """\
XRUN_SRUN=$!
XRUN_PREEMPTED=0
# SIGTERM reaches this shell only when Slurm ends the job itself (scancel, the end of a
# preemption's grace: Slurm's own REQUEUE then requeues it): never requeue on top of that.
XRUN_ENDED_BY_SLURM=0
trap 'XRUN_ENDED_BY_SLURM=1' TERM
{batch_trap}wait "$XRUN_SRUN"
XRUN_RC=$?
while kill -0 "$XRUN_SRUN" 2>/dev/null; do
    wait "$XRUN_SRUN"
    XRUN_RC=$?
done
# The tasks got a stop request this shell did not (a preemption's SIGTERM inside its GraceTime):
# the workers stopped at an agreed step and saved. Slurm counts a job that ends itself inside the
# grace as done, so it is requeued here, once.
if [ "$XRUN_PREEMPTED" -eq 0 ] && [ "$XRUN_ENDED_BY_SLURM" -eq 0 ] && [ -s "${stop_record_env}" ]; then
    echo "xrun: the replicas stopped on request ($(head -n1 "${stop_record_env}"))" >&2
    echo "$(date +%s) $(head -n1 "${stop_record_env}" | cut -d' ' -f2 | sed 's/^SIG//') restart=${{SLURM_RESTART_COUNT:-0}}" >>"$XRUN_LOG_DIR/preempted"
    XRUN_PREEMPTED=1
fi
{judge}
# Requeue while retries are left: after a preemption up to {max_retries} times (the roles'
# smallest max_retries), after a failure up to {fail_retries} (0 when the runtime agents
# restart the workers in place instead). The job keeps its id; SLURM_RESTART_COUNT counts.
XRUN_RETRIES=0
if [ "$XRUN_PREEMPTED" -eq 1 ]; then
    XRUN_RETRIES={max_retries}
elif [ "$XRUN_RC" -ne 0 ]; then
    XRUN_RETRIES={fail_retries}
fi
if [ "$XRUN_RETRIES" -gt 0 ]; then
    if [ "${{SLURM_RESTART_COUNT:-0}}" -lt "$XRUN_RETRIES" ] && [ "$XRUN_ENDED_BY_SLURM" -eq 0 ]; then
        echo "xrun: attempt ${{SLURM_RESTART_COUNT:-0}} ended with exit code $XRUN_RC; requeueing" >&2
        # Until Slurm shows it PENDING again, the job looks FAILED: this file says otherwise.
        echo "${{SLURM_RESTART_COUNT:-0}}" >"$XRUN_LOG_DIR/requeued"
        scontrol requeue "$SLURM_JOB_ID" || rm -f "$XRUN_LOG_DIR/requeued"
    fi
fi
exit "$XRUN_RC"
"""


def build_request(
    app: AppDef,
    options: SlurmOptions,
    chdir: str,
    info: ClusterInfo,
    path_prefix: str | None,
    workspace: Workspace | None = None,
    array: ArrayJob | None = None,
) -> SlurmBatchRequest:
    """The sbatch script for ``app`` (pure: no Slurm command runs); with ``array``, a job
    array whose task i runs sweep trial i (logs under ``<jobid>/<i>/``)."""
    for role in app.roles:
        _check_role(role)
    log_root = f"{chdir.rstrip('/')}/{LOG_SUBDIR}"
    log_dir = shlex.quote(log_root) + '/"$SLURM_JOB_ID"'
    trial_dir = ""
    if array:
        log_dir = shlex.quote(log_root) + '/"$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID"'
        trial_dir = "<trial>/"
    max_retries, fail_retries = requeue_limits(app)

    lines = [
        "#!/bin/bash",
        f"# xrun app {app.name!r}: {len(app.roles)} role(s), generated by xrun's slurm scheduler.",
        f"# Logs: {log_root}/<jobid>/{trial_dir}<role>/<replica>.stdout|.stderr",
    ]
    if array:
        lines.append(f"# A job array: task i runs sweep trial i ({array.trials} trials).")
    job_opts = _job_sbatch_opts(app, options, log_root, chdir, array)
    for i, role in enumerate(app.roles):
        if i > 0:
            lines.append("#SBATCH hetjob")
        lines.append(f"# role {role.name!r}: {role.num_replicas} replica(s)")
        opts = (job_opts if i == 0 else []) + _role_sbatch_opts(role, options, info)
        lines += [_sbatch_line(o) for o in opts]
    if options.extra_sbatch_args:
        lines.append("# extra_sbatch_args (as given)")
        lines += [_sbatch_line(o) for o in options.extra_sbatch_args]
    lines.append("")

    path_line = ""
    if path_prefix:
        path_line = (
            "# The submitting interpreter's bin dir first: `python3` in a task is xrun's Python.\n"
            f'export PATH={shlex.quote(path_prefix)}:"$PATH"\n'
        )
    mkdirs = " ".join(f'"$XRUN_LOG_DIR"/{shlex.quote(r.name)}' for r in app.roles)
    sig = options.warning.name if options.warning else None
    replica_trap = batch_trap = ""
    if sig:
        path_line += (
            f"# The runtime agent passes SIG{sig} on to its workers (a checkpoint hook) too.\n"
            f"export {AGENT_SIGNALS_ENV}={_AGENT_SIGNALS},SIG{sig}\n"
        )
        replica_trap = f"    trap 'kill -{sig} \"$child\" 2>/dev/null' {sig}\n"
        batch_trap = _SIGNAL_HANDLER + f"trap 'xrun_on_signal {sig}' {sig}\n"
    lines.append(
        _PRELUDE.format(
            log_dir=log_dir,
            rank0_env=RANK0_HOST_ENV,
            token_env=TOKEN_ENV,
            stop_record_env=STOP_RECORD_ENV,
            stop_grace_env=STOP_GRACE_ENV,
            role_env=ROLE_ENV,
            replica_id_env=REPLICA_ID_ENV,
            path_line=path_line,
            mkdirs=mkdirs,
            replica_trap=replica_trap,
            grace=options.warning.seconds if options.warning else 0,
        )
    )

    if array:
        lines.append(array.setup)
    groups = []
    offset = 0
    for i, role in enumerate(app.roles):
        var = f"XRUN_CMD_{i}"
        lines += [
            f"# role {role.name!r}, replicas {offset}..{offset + role.num_replicas - 1} of the step",
            f"{var}=$(cat <<'XRUN_EOF'",
            _role_command(role, offset, chdir),
            "XRUN_EOF",
            ")",
        ]
        srun_opts = f"--het-group={i} " if len(app.roles) > 1 else ""
        srun_opts += "--ntasks-per-node=1 "
        if role.resource.cpu > 0:
            # srun does not inherit sbatch's --cpus-per-task in every version (22.05 does not).
            srun_opts += f"--cpus-per-task={role.resource.cpu} "
        groups.append(f'{srun_opts}bash -c "${var}"')
        offset += role.num_replicas
    lines.append("")
    survive = losses.may_lose(app)
    if survive:
        # An elastic job (or one with spares) carries on without a failed or lost node: its
        # agents re-form the group. Why these options: schedulers/slurm/losses.py.
        lines.append(losses.before_step(app))
        lines.append(
            "# One step for all replicas; elastic/spares: the others go on if one is lost."
        )
        srun = "srun " + losses.SRUN_OPTS
    else:
        lines.append("# One step for all replicas; one replica failing stops the others.")
        srun = "srun --kill-on-bad-exit=1 "
    lines.append(srun + " \\\n    : ".join(groups) + " &")
    lines.append(
        _EPILOGUE.format(
            max_retries=max_retries,
            fail_retries=fail_retries,
            batch_trap=batch_trap,
            stop_record_env=STOP_RECORD_ENV,
            judge=losses.judge(app) if survive else "",
        )
    )

    # On the command line, not an #SBATCH line: those cannot quote, and a user's comment may
    # contain spaces (TorchX passes it the same way). The xrun: marker leads it (for `list`).
    argv = [
        "sbatch",
        "--parsable",
        f"--comment={format_comment(app, options.comment or '')}",
    ]
    return SlurmBatchRequest(
        app_name=app.name,
        script="\n".join(lines),
        sbatch_argv=argv,
        chdir=chdir,
        log_root=log_root,
        roles={r.name: r.num_replicas for r in app.roles},
        workspace=workspace,
    )
