"""A sweep as ONE Slurm job array: the request pieces (pure, like request.py).

``sbatch --array=0-(N-1)[%K]``: array task i runs trial i. The job is the sweep's template app
(one role; several nodes per task where the trial has them) with each ``{{name}}`` turned into
``"${XRUN_SWEEP_NAME}"``, expanded by the task's shell; the trial table travels in the script
itself, as a ``case`` on ``$SLURM_ARRAY_TASK_ID`` that exports the task's values::

    case "$SLURM_ARRAY_TASK_ID" in
    0) XRUN_SWEEP_LR=0.1 XRUN_SWEEP_WD=0 ;;
    1) XRUN_SWEEP_LR=0.1 XRUN_SWEEP_WD=1e-4 ;;
    ...

Each task logs under ``slurm-logs/<array job id>/<trial>/<role>/<replica>.*`` (request.py's
layout, one level down), requeues itself alone (``scontrol requeue $SLURM_JOB_ID``: a task's
own id) while ``max_retries`` allow, and a failed task does not stop the others.

What one array cannot hold, refused before anything is submitted (exit 2): several roles
(heterogeneous jobs cannot be arrays: run such a sweep on local_cwd or docker), placeholders
outside the command line and env (every task gets the same allocation), and trials that need
one AppDef each (see :class:`xrun.sweeps.plan.SweepPlan`).
"""

from __future__ import annotations

import dataclasses
import re

from xrun.contract import RDZV_PORT_ENV, SWEEP_SIZE_ENV, TRIAL_INDEX_ENV
from xrun.errors import UsageError
from xrun.specs import AppDef, appdef_to_dict
from xrun.sweeps.plan import PLACEHOLDER_RE, SweepPlan, env_name, placeholders, substitute

from .request import ArrayJob, task_env

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def array_spec(trials: int, max_parallel: int | None) -> str:
    """``0-(N-1)`` and ``%K`` when at most K tasks may run at once."""
    return f"0-{trials - 1}" + (f"%{max_parallel}" if max_parallel else "")


def _quote(text: str) -> str:
    return text if _PLAIN.fullmatch(text) else "'" + text.replace("'", "'\\''") + "'"


def array_template(plan: SweepPlan) -> AppDef:
    """The one app every task runs: placeholders become the task's ``XRUN_SWEEP_*`` vars."""
    if plan.template is None:
        raise UsageError(
            "slurm runs a sweep as one job array, one command for every trial, and this "
            f"sweep has none: {plan.why_no_template}. Use plain values where a placeholder "
            "reaches the command line, or run the sweep on local_cwd or docker"
        )
    app = plan.template
    if len(app.roles) != 1:
        names = ", ".join(r.name for r in app.roles)
        raise UsageError(
            f"slurm cannot run a sweep of a {len(app.roles)}-role app ({names}) as a job array "
            "(a heterogeneous job cannot be an array); run it with -s local_cwd or -s docker, "
            "or make it one role"
        )
    role = app.roles[0]
    fixed = appdef_to_dict(AppDef(name="", roles=[role]))["roles"][0]
    for key in ("entrypoint", "args", "env"):
        fixed.pop(key)
    for key, value in fixed.items():
        found = placeholders(repr(value))
        if found:
            raise UsageError(
                f"slurm: {{{{{found[0]}}}}} is in role {role.name!r}'s {key}, but every task of a "
                "job array gets the same allocation; placeholders may only be in the command "
                "line and the env on slurm (or run the sweep on local_cwd or docker)"
            )
    refs = {n: task_env(env_name(n)) for n in plan.params}
    task_role = dataclasses.replace(
        role,
        entrypoint=substitute(role.entrypoint, refs),
        args=[substitute(a, refs) for a in role.args],
        env={k: substitute(v, refs) for k, v in role.env.items()},
    )
    name = PLACEHOLDER_RE.sub(lambda m: m.group(1), app.name)
    return AppDef(name=name, roles=[task_role], metadata=dict(app.metadata))


_FREE_PORT = (
    "python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"
)


def trial_table(plan: SweepPlan, multi_node: bool) -> str:
    """The shell code that gives an array task its trial's values (see the module doc)."""
    names = [env_name(p) for p in plan.params]
    lines = [
        f"# The trial table ({len(plan)} trials): this task's values, by its array index.",
        "# shellcheck disable=SC2016  # the values are literal text, '$' included",
        'case "$SLURM_ARRAY_TASK_ID" in',
    ]
    for i, values in enumerate(plan.trials):
        assigns = " ".join(f"{env_name(k)}={_quote(v)}" for k, v in values.items())
        lines.append(f"{i}) {assigns} ;;")
    lines += [
        '*) echo "xrun: this sweep has no trial $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;',
        "esac",
        f"export {' '.join(names)}",
        f'export {TRIAL_INDEX_ENV}="$SLURM_ARRAY_TASK_ID" {SWEEP_SIZE_ENV}={len(plan)}',
    ]
    if multi_node:
        lines += [
            "# Trials running at once may share nodes: each takes a free rendezvous port on its",
            f"# first node, where this shell runs (a role's own {RDZV_PORT_ENV} still wins).",
            f"{RDZV_PORT_ENV}=$({_FREE_PORT})",
            f"export {RDZV_PORT_ENV}",
        ]
    return "\n".join(lines) + "\n"


def array_job(plan: SweepPlan, template: AppDef, max_parallel: int | None) -> ArrayJob:
    multi = any(r.num_replicas > 1 for r in template.roles)
    return ArrayJob(
        spec=array_spec(len(plan), max_parallel),
        setup=trial_table(plan, multi),
        trials=len(plan),
    )
