"""Running Slurm's commands (sbatch, squeue, scontrol, sacct, scancel, sinfo): the one place
that bounds how long xrun waits for them and says in one line why it stopped.

Slurm's clients wait for the controller on their own: ``sbatch`` sleeps and retries for as long
as the controller is "temporarily unable to accept job" (its job table is full: MaxJobCount,
with finished jobs kept for MinJobAge), and every client retries a controller that does not
answer. xrun waits ``TIMEOUT_S`` and then raises ``SchedulerError`` with the command and the
last thing it printed, instead of a traceback (``subprocess.TimeoutExpired``).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess

from xrun.errors import SchedulerError, UsageError

__all__ = ["NOT_FOUND", "TIMEOUT_S", "run"]

NOT_FOUND = "Slurm commands not found ({cmd}); is this a Slurm login node?"
# Long enough for a busy controller (sbatch of a 1,000-task array takes well under a second on
# a quiet one), short enough that a stuck one is reported while the user still waits.
TIMEOUT_S = 60.0


def run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``argv``'s result (output captured as text, any exit code); UsageError when the command
    is not installed, SchedulerError when it has not finished after ``TIMEOUT_S`` seconds."""
    if shutil.which(argv[0]) is None:
        raise UsageError(NOT_FOUND.format(cmd=argv[0]))
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise SchedulerError(_timed_out(argv, e)) from None


def _timed_out(argv: list[str], e: subprocess.TimeoutExpired) -> str:
    said = e.stderr or b""
    text = said.decode("utf-8", "replace") if isinstance(said, bytes) else said
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
    msg = f"`{shlex.join(argv)}` did not finish in {TIMEOUT_S:g} s"
    if last:
        msg += f" (it said: {last})"
    if "temporarily unable to accept job" in text:
        # What a full job table looks like from outside: nothing was submitted.
        return (
            f"{msg}: the Slurm controller is not accepting jobs (its job table is full, see "
            f"MaxJobCount and MinJobAge in `scontrol show config`); nothing was submitted, "
            f"try again once jobs have aged out"
        )
    return (
        f"{msg}: the Slurm controller did not answer in time; check it with `scontrol ping` "
        f"and `sdiag`, then try again"
    )
