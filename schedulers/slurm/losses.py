"""A job that may lose replicas (an elastic role, or ``dist.ddp --spares``) survives a lost node.

Measured on the real 22.05 cluster (3 nodes, one task each, one of them lost mid-run; the
figures are in docs/schedulers.md#losing-a-node):

- a replica's processes SIGKILLed: without ``--kill-on-bad-exit=1`` the other tasks of the step
  run on, but srun then exits 137 and so would the batch script: the job ends FAILED;
- the node set DOWN (``scontrol update state=down``, what slurmctld does once a dead node's
  slurmd stops answering): without ``sbatch --no-kill`` the whole job ends NODE_FAIL at once
  (0.4 s); with it but one plain srun step, Slurm kills every task of the step; with
  ``sbatch --no-kill`` AND ``srun --no-kill`` the node leaves the job's NodeList and the other
  tasks run on to their end (one step per node survives too, but then the lost step's srun
  exits 0: nothing would tell the loss).

So such a job gets ``--no-kill`` on both, ``--kill-on-bad-exit=0`` (a site may set
``KillOnBadExit=1``), and the batch script judges the end itself, from the replicas' ``.exit``
files instead of srun's code: a replica that started (``.node``) but wrote no code was lost with
its node and gets ``lost``; the job succeeds when each role has at least its floor of replicas
that exited 0 (``max(min_replicas, 1)``, all of them for a fixed-size role), as local_cwd and
docker judge it (:func:`xrun.schedulers.api.replicas_role_may_lose`).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from ..api import replicas_role_may_lose

if TYPE_CHECKING:
    from xrun.specs import AppDef

# What a lost replica's .exit says (no exit code: its node went with it).
LOST = "lost"

SRUN_OPTS = "--no-kill --kill-on-bad-exit=0 "
SBATCH_OPT = "--no-kill"


def may_lose(app: AppDef) -> bool:
    """Whether some role of ``app`` may lose a replica and go on (elastic, or spares)."""
    return any(replicas_role_may_lose(r) > 0 for r in app.roles)


def _roles(app: AppDef) -> str:
    # "name num floor" per role, read by the functions below
    return " ".join(
        shlex.quote(f"{r.name}:{r.num_replicas}:{r.num_replicas - replicas_role_may_lose(r)}")
        for r in app.roles
    )


def before_step(app: AppDef) -> str:
    """Shell run before srun: this attempt's codes only (a requeued job's old ones go)."""
    return (
        "# This attempt's exit codes only: the end is judged from them (schedulers/slurm/losses.py).\n"
        f"for xrun_r in {_roles(app)}; do\n"
        '    rm -f "$XRUN_LOG_DIR/${xrun_r%%:*}/"*.exit "$XRUN_LOG_DIR/${xrun_r%%:*}/"*.node\n'
        "done\n"
    )


def judge(app: AppDef) -> str:
    """Shell run after srun ended with a failure: the job's code from the replicas' codes."""
    return f"""\
# A replica lost with its node wrote no code; the job succeeds when each role kept its floor of
# replicas that exited 0 (schedulers/slurm/losses.py): srun's code counts the lost ones too.
if [ "$XRUN_RC" -ne 0 ] && [ "$XRUN_PREEMPTED" -eq 0 ] && [ "$XRUN_ENDED_BY_SLURM" -eq 0 ]; then
    xrun_kept=1
    for xrun_r in {_roles(app)}; do
        xrun_name=${{xrun_r%%:*}}; xrun_rest=${{xrun_r#*:}}
        xrun_n=${{xrun_rest%%:*}}; xrun_floor=${{xrun_rest#*:}}; xrun_ok=0; xrun_k=0
        while [ "$xrun_k" -lt "$xrun_n" ]; do
            xrun_f="$XRUN_LOG_DIR/$xrun_name/$xrun_k"
            if [ -e "$xrun_f.node" ] && [ ! -e "$xrun_f.exit" ]; then
                echo "xrun: $xrun_name/$xrun_k on $(cat "$xrun_f.node") was lost (no exit code)" >&2
                echo {LOST} >"$xrun_f.exit"
            fi
            [ "$(cat "$xrun_f.exit" 2>/dev/null)" = 0 ] && xrun_ok=$((xrun_ok + 1))
            xrun_k=$((xrun_k + 1))
        done
        [ "$xrun_ok" -ge "$xrun_floor" ] || xrun_kept=0
    done
    if [ "$xrun_kept" -eq 1 ]; then
        echo "xrun: srun ended with $XRUN_RC, but every role kept enough replicas that succeeded" >&2
        XRUN_RC=0
    fi
fi
"""
