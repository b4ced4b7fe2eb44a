"""``xrun stacks HANDLE``: every rank's Python stack, grouped by where the ranks are.

Ranks whose main threads have the same stack print once, the smallest group (the odd one out)
first; ``--json`` prints the ranks' stacks as read (per role, global rank -> threads or error).
The scheduler gathers each node's answer (``Runner.stacks``); the grouping is the one the
agent's stall watchdog writes into a failure report (``xrun.runtime.diagnose.groups``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from xrun.limits import to_float
from xrun.runner import Runner
from xrun.runtime.diagnose.groups import format_groups, group, headline

if TYPE_CHECKING:
    from xrun.schedulers.stacks import AppStacks


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stacks", help="print every rank's Python stack, grouped")
    p.add_argument(
        "handle",
        metavar="HANDLE",
        help="SCHEDULER://SESSION/APP_ID of a running app, or a sweep's trial SWEEP_HANDLE/TRIAL",
    )
    p.add_argument("--json", action="store_true", help="print the stacks as JSON")
    p.add_argument(
        "--timeout",
        default="10",
        metavar="SECONDS",
        help="how long to wait for every node's answer (default 10, at least 1)",
    )


def main(ns: argparse.Namespace) -> int:
    from xrun.schedulers.stacks import check_timeout

    # ASCII only (to_float): float() reads other scripts' digits, which no xrun option takes.
    timeout = check_timeout(to_float(str(ns.timeout)[:50]), given=ns.timeout)
    with Runner() as runner:
        stacks = runner.stacks(ns.handle, timeout)
    if ns.json:
        json.dump(stacks.to_json(), sys.stdout, indent=1)
        print()
    else:
        for role, ranks in stacks.roles.items():
            groups = group(ranks)
            title = f"role {role}: " if len(stacks.roles) > 1 else ""
            print(f"{title}{len(ranks)} ranks, {len(groups)} group(s): {headline(groups)}")
            print(format_groups(ranks, groups))
        for note in stacks.notes:
            print(f"note: {note}", file=sys.stderr)
    why = _none_read(stacks)
    if why:
        print(f"xrun: no stack read from {ns.handle}: {why}", file=sys.stderr)
        return 1
    return 0


def _none_read(stacks: AppStacks) -> str:
    """Why not a single rank's stack was read ("" when one was): the ranks' own reasons (py-spy
    missing, not Python, ...), else the replicas' (no agent answered, ...)."""
    ranks: list[dict[str, Any]] = [r for rs in stacks.roles.values() for r in rs.values()]
    if any(r.get("threads") for r in ranks):
        return ""
    reasons = list(dict.fromkeys(str(r.get("error") or "no Python thread") for r in ranks))
    reasons += [n for n in stacks.notes if not reasons]
    if not reasons:
        return "no replica answered"
    more = f" (and {len(reasons) - 1} other reason(s) above)" if len(reasons) > 1 else ""
    return reasons[0] + more
