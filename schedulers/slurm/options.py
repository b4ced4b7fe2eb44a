"""The slurm scheduler's run options (``-cfg``, ``.xrunconfig [slurm]``) as one value.

``runopts(SlurmOptions).resolve`` converts and checks what the user gave (the ``signal`` option
is parsed there, once); the request reads the typed fields. ``xrun runopts`` and
``xrun configure`` show these fields' types, defaults and help.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from functools import cached_property

from xrun.errors import UsageError
from xrun.limits import capped_int, is_digits

from ..options import option


@dataclass(frozen=True)
class WarningSignal:
    """The ``signal`` option parsed: Slurm sends ``SIG<name>`` ``seconds`` before the end."""

    name: str  # without SIG, e.g. USR2
    seconds: str  # as given, digits only


def parse_signal(text: str) -> WarningSignal | None:
    """``USR2@90``, ``B:SIGUSR2@90``, ``12@90`` -> (USR2, 90); None for ''; else UsageError."""
    text = text.strip()
    if not text:
        return None
    name = text.split(":", 1)[-1].split("@", 1)[0].strip().upper()
    name = name.removeprefix("SIG")
    if is_digits(name):
        try:
            name = _signal.Signals(capped_int(name, 128)).name.removeprefix("SIG")
        except ValueError:
            name = ""
    seconds = text.rpartition("@")[2].strip()
    # Slurm takes 0..65535 seconds before the end (sbatch refuses more, at submit).
    in_range = is_digits(seconds) and capped_int(seconds, 65535) <= 65535
    if not name or not hasattr(_signal, f"SIG{name}") or "@" not in text or not in_range:
        raise UsageError(
            f"run option signal={text!r} is invalid; expected SIG@SECONDS, e.g. USR2@90 "
            "(the signal name or number, then how many seconds before the end, 0..65535)"
        )
    return WarningSignal(name, seconds)


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    partition: str | None = option("partition (--partition); default: the cluster's default")
    time: str | None = option("time limit (--time), e.g. 1:00:00 or 2-00:00:00")
    account: str | None = option("account to charge (--account)")
    qos: str | None = option("quality of service (--qos)")
    constraint: str | None = option("node features (--constraint), e.g. a100")
    comment: str | None = option(
        "added to the job comment, which is xrun:APP;ROLE=N[,COMMENT] (spaces are fine)"
    )
    mail_user: str | None = option(
        "where Slurm mails job events (--mail-user)", aliases=("mail-user",)
    )
    mail_type: str | None = option(
        "which events are mailed (--mail-type), e.g. END,FAIL", aliases=("mail-type",)
    )
    job_name: str | None = option("job name (--job-name); default: the app name")
    job_dir: str | None = option(
        "a new directory: the workspace is copied there (honouring .xrunignore/.gitignore) "
        "and the job runs in it (--chdir), isolated from later edits; default: the cwd"
    )
    exclusive: bool = option("whole nodes for the job (--exclusive)", default=False)
    signal: str | None = option(
        "preemption/time-limit warning signal to the batch shell, SIG@SECONDS; it is passed "
        "to the replicas and the job requeues up to max_retries times (the roles' smallest; "
        "after a failure only roles without in-place agent restarts); '' for none",
        default="USR2@90",
    )
    extra_sbatch_args: list[str] | None = option(
        "raw sbatch options added as #SBATCH lines, e.g. --reservation=x;--gres=gpu:2"
    )
    python_path: str | None = option(
        "dir put first on PATH in every task so that python3 is this interpreter "
        "(default: the submitting interpreter's bin dir); '' leaves PATH as the nodes set it"
    )

    def __post_init__(self) -> None:
        self.warning  # noqa: B018 - parsed now: a bad signal is an error before anything runs

    @cached_property
    def warning(self) -> WarningSignal | None:
        """The ``signal`` option parsed; None when it is unset or ''."""
        return parse_signal(self.signal or "")
