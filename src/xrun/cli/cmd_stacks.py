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

from xrun.errors import UsageError
from xrun.limits import check_duration
from xrun.runner import Runner
from xrun.runtime.diagnose.groups import format_groups, group, headline


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
        help="how long to wait for every node's answer (default 10)",
    )


def main(ns: argparse.Namespace) -> int:
    try:
        timeout = check_duration(float(str(ns.timeout)[:50]), "--timeout")
    except ValueError:
        raise UsageError(
            f"--timeout {ns.timeout!r} is invalid: expected a number of seconds, e.g. 10"
        ) from None
    with Runner() as runner:
        stacks = runner.stacks(ns.handle, timeout)
    if ns.json:
        json.dump(stacks.to_json(), sys.stdout, indent=1)
        print()
        return 0 if stacks.roles else 1
    for role, ranks in stacks.roles.items():
        groups = group(ranks)
        title = f"role {role}: " if len(stacks.roles) > 1 else ""
        print(f"{title}{len(ranks)} ranks, {len(groups)} group(s): {headline(groups)}")
        print(format_groups(ranks, groups))
    for note in stacks.notes:
        print(f"note: {note}", file=sys.stderr)
    if not stacks.roles:
        print(f"xrun: no stacks from {ns.handle}", file=sys.stderr)
        return 1
    return 0
