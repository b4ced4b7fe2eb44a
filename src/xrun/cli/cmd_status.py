"""``xrun status HANDLE``: an app's state, per-replica host, exit code and error; a sweep's
table of trials; a trial's (``SWEEP/TRIAL``) own app status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from xrun.cli.common import HANDLE_HELP, not_found
from xrun.cli.spares_view import spares_lines
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.api import LogQuery, Stream
from xrun.specs import AppStatus, RoleStatus
from xrun.sweeps.handles import Target
from xrun.sweeps.metrics import sort_trials, trial_metrics
from xrun.sweeps.status import SweepStatus


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("status", help="show an app's status (a sweep's: a table of its trials)")
    c.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)
    # a sweep's trials, side by side by what they tracked (docs/tracking.md)
    c.add_argument("--sort", metavar="KEY", help="a sweep: order trials by this metric or value")
    c.add_argument("--desc", action="store_true", help="with --sort: largest first")
    c.add_argument(
        "--roles",
        metavar="ROLE[,ROLE...]",
        help="an app: show only these roles (TorchX's flag); default: every role",
    )


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        target = runner.target(ns.handle)
        if (ns.sort is not None or ns.desc) and not target.sortable:
            raise UsageError(f"--sort/--desc order a sweep's trials; {ns.handle} is no sweep")
        status = runner.status(target)
        if status is None:
            raise not_found(str(target))
        if isinstance(status, SweepStatus):
            if ns.roles is not None:
                raise UsageError(f"--roles picks an app's roles; {ns.handle} is a sweep")
            _add_metrics(status, ns.sort, ns.desc)
        elif ns.roles is not None:
            status.roles = _only(status, ns.roles)
        print(f"Handle: {target}")
        print(status.format())
        if not isinstance(status, SweepStatus):
            for line in _spares(runner, target, status):
                print(line)
    return 0


def _spares(runner: Runner, target: Target, status: AppStatus) -> list[str]:
    """A job with spares: its spares, replacements, budget and quarantine (spares_view.py)."""
    try:
        app = runner.describe(target)
    except Exception:  # noqa: BLE001 - extra lines: never what makes `status` fail
        return []

    def read(role: str, k: int) -> Iterable[str]:
        try:
            return list(runner.logs(target, LogQuery(role, k, streams=Stream.STDERR)))
        except (OSError, UsageError):
            return []

    return spares_lines(app, status, read)


def _only(status: AppStatus, roles: str) -> list[RoleStatus]:
    """``--roles a,b``: the role statuses of those roles, in the app's order."""
    wanted = [r.strip() for r in roles.split(",") if r.strip()]
    have = [rs.role for rs in status.roles]
    unknown = [r for r in wanted if r not in have]
    if unknown or not wanted:
        raise UsageError(
            f"--roles {roles!r}: no role {', '.join(map(repr, unknown)) or 'named'} in this app; "
            f"expected a comma-separated list of {', '.join(have)}"
        )
    return [rs for rs in status.roles if rs.role in wanted]


def _add_metrics(st: SweepStatus, sort: str | None, desc: bool) -> None:
    """The trials' tracked numeric metadata as columns, sorted by ``--sort KEY`` (#25)."""
    st.metrics = trial_metrics(st.handle, st.trials, warn=_warn)
    if sort is not None:  # '' too: an unknown key, exit 2 (M9)
        st.trials = sort_trials(st.trials, st.metrics, st.params, sort, desc)


def _warn(line: str) -> None:
    print(f"xrun: {line}", file=sys.stderr, flush=True)
