"""``xrun tracker list jobs|metadata|artifacts``: TorchX 0.7.0's ``torchx tracker`` commands,
with their output (tabulate's ``simple`` tables, written here: tabulate is no dependency).

The tracker read is :func:`xrun.tracker.query.tracker`'s: the first one configured, else the
embedded default under xrun's state dir.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from xrun.cli.parser_base import Parser
from xrun.tracker import query

MIN_PADDING = 2  # tabulate: a header is at least 2 narrower than its column


def main(ns: argparse.Namespace) -> int:
    what = ns.tracker_list
    if what == "jobs":
        jobs = query.list_jobs(ns.parent_run_id)
        print(table([[j] for j in jobs], ["JOB ID"]))
    elif what == "metadata":
        md = query.list_metadata(ns.RUN_ID)
        print(table([[k, v] for k, v in md.items()], ["ID", "VALUE"]))
    else:
        found = query.list_artifacts(ns.RUN_ID, ns.artifact)
        print(
            table([[a.name, a.path, a.metadata] for a in found], ["ARTIFACT", "PATH", "METADATA"])
        )
    return 0


def add_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tracker list {jobs,metadata,artifacts}`` (TorchX's arguments)."""
    p = commands.add_parser(
        "tracker", help="query experiment tracking: list jobs, metadata, artifacts"
    )
    parser_class = Parser
    sub: Any = p.add_subparsers(
        dest="tracker_cmd", metavar="list", required=True, parser_class=parser_class
    )
    ls = sub.add_parser("list", help="list tracked jobs, or a job's metadata or artifacts")
    kinds: Any = ls.add_subparsers(
        dest="tracker_list",
        metavar="{jobs,metadata,artifacts}",
        required=True,
        parser_class=parser_class,
    )
    jobs = kinds.add_parser("jobs", help="the tracked jobs (run ids)")
    jobs.add_argument("--parent-run-id", help="only the children of this run (a sweep's trials)")
    md = kinds.add_parser("metadata", help="a job's metadata")
    md.add_argument("RUN_ID", help="the job's run id (its handle)")
    art = kinds.add_parser("artifacts", help="a job's artifacts")
    art.add_argument("--artifact", help="only the artifact of this name")
    art.add_argument("RUN_ID", help="the job's run id (its handle)")


# --------------------------------------------------------------------------- the tables
def _number(v: object) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float | str):
        try:
            return float(v)
        except (ValueError, OverflowError):  # 10**400 is a valid JSON integer (P6)
            return None
    return None


def _is_int(v: object) -> bool:
    if isinstance(v, int) and not isinstance(v, bool):
        return True
    return isinstance(v, str) and v.strip().lstrip("+-").isdigit()


def _column(values: list[object]) -> tuple[list[str], bool]:
    """A column's cells as text, and whether it is numeric (then aligned right, on the
    decimal point), as tabulate decides: numeric when every value given reads as a number."""
    given = [v for v in values if v is not None]
    nums = [_number(v) for v in given]
    text = ["" if v is None else str(v) for v in values]
    if not given or any(n is None or math.isnan(n) for n in nums):
        return text, False
    if all(_is_int(v) for v in given):
        try:
            return ["" if v is None else str(int(str(v))) for v in values], True
        except ValueError:  # more digits than int() reads: shown as given
            return text, False
    cells = ["" if v is None else format(float(str(v)), "g") for v in values]
    after = [len(c) - c.index(".") - 1 if "." in c else -1 for c in cells]
    most = max(after)
    return [c + " " * (most - a) if c else c for c, a in zip(cells, after, strict=True)], True


def table(rows: list[list[object]], headers: list[str]) -> str:
    """tabulate(rows, headers)'s ``simple`` format."""
    cols = [_column([r[i] for r in rows]) for i in range(len(headers))]
    widths = [
        max([len(h) + MIN_PADDING, *(len(c) for c in cells)])
        for h, (cells, _) in zip(headers, cols, strict=True)
    ]

    def line(cells: list[str], numeric: list[bool]) -> str:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    kinds = [num for _, num in cols]
    out = [line(headers, kinds), "  ".join("-" * w for w in widths)]
    out += [line([cells[i] for cells, _ in cols], kinds) for i in range(len(rows))]
    return "\n".join(out)
