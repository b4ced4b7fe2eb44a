"""``python -m benchmarks [--smoke] [--only 1,3] [--reps N] [--out FILE]``

Runs the eight measures of issue #6 (1-8), the two of issue #18 (sweeps, 9-10), the four of
issue #14 (the agent's store, 11-14), the two of issue #24 (fault diagnosis, 15; a hang's
autopsy, 16), the two of issue #34 (a snapshot's cost, 17; the warm recovery drill, 18), the one
of issue #33 (real Slurm preemptions, 19: K and the checkpoint's seconds C via
XRUN_BENCH_PREEMPT_K/_C, see benchmarks/preemption.py), the one of issue #35 (a node-loss drill
with a spare, 20), the drills of 18 and 20 on docker and slurm (21, issues #34 and #35) and the
one of issue #36 (Python callables on Slurm beside submitit, 22) in this one process tree,
prints each table as it finishes and writes every figure to
``benchmarks/results/latest.json`` (rewritten after each measure, so an interrupted run keeps
what it measured). Exit status: 0 when every contender that is
installed did its job, 1 when an xrun contender failed (its row says why; a reference such as
torchrun failing is reported but does not fail the run), 2 for a bad option.
``--smoke`` (CI, as tests/e2e/test_benchmarks_smoke.py): tiny sizes, one repetition, about 15
minutes on the 2-core VM (measures 16, 18, 19 and 21 are most of it: real hangs, restarts,
preemptions, node losses).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import Row

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"

# key -> (title, "module:function"); imported on use so one broken measure cannot stop the rest
MEASURES: dict[str, tuple[str, str]] = {
    "1": ("launch a 1x4 do-nothing job (local_cwd), end to end", "launch:measure_1"),
    "2": ("launch a 2x2 do-nothing job (two agents, rendezvous), end to end", "launch:measure_2"),
    "3": ("a gloo all_reduce job, end to end", "launch:measure_3"),
    "4": ("agent peak RSS", "rss:measure_4"),
    "5": ("import xrun and run --dryrun", "startup:measure_5"),
    "6": ("rendezvous of N agents", "scale:measure_6"),
    "7": ("one worker failure + restart", "restart:measure_7"),
    "8": ("tee: -t 3 vs no tee", "tee:measure_8"),
    "9": ("sweeps: --dryrun of a 10,000-trial grid", "sweeps:measure_9"),
    "10": ("sweeps: status of a 1,000-trial slurm sweep (one squeue)", "sweeps:measure_10"),
    "11": ("rendezvous of N agents spread over processes (issue #14)", "store:measure_11"),
    "12": ("the workers' store under torch's TCPStore clients (issue #14)", "store:measure_12"),
    "13": ("a 2-agent x 8-worker gloo all_reduce job, end to end", "launch:measure_13"),
    "14": ("reliability: 1x2 gloo jobs under a port thief", "reliability:measure_14"),
    "15": (
        "fault diagnosis: the first screen names the rank and cause (issue #24)",
        "diagnosis:measure_15",
    ),
    "16": (
        "a hang's autopsy: xrun stacks, the stall watchdog, their cost (issue #24)",
        "hang:measure_16",
    ),
    "17": (
        "training state in shared memory: the cost of a commit (issue #34)",
        "snapshot:measure_17",
    ),
    "18": (
        "recovery drill: kill -9 of a worker -> next full-world step, --recover warm (issue #34)",
        "recovery:measure_18",
    ),
    "19": (
        "real Slurm preemptions: agreed-step checkpoint, one requeue, exact resume (issue #33)",
        "preemption:measure_19",
    ),
    "20": (
        "node-loss drill: a spare takes a SIGKILLed node's slot, state from peers (issue #35)",
        "node_loss:measure_20",
    ),
    "21": (
        "recovery and node-loss drills on docker and slurm (issues #34, #35)",
        "drills:measure_21",
    ),
    "22": (
        "Python callables on Slurm: submit -> result, beside submitit (issue #36)",
        "calls:measure_22",
    ),
}


def _load(spec: str) -> Callable[[int, bool], list[Row]]:
    from importlib import import_module

    module, func = spec.split(":")
    fn: Callable[[int, bool], list[Row]] = getattr(import_module(f"benchmarks.{module}"), func)
    return fn


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="xrun side by side with torchrun (and TorchX where installed) and the floor.",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (CI)")
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="measured repetitions per contender (default 5; 1 with --smoke)",
    )
    p.add_argument("--only", default="", help="comma-separated measure numbers, e.g. 1,3,8")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON file (default {DEFAULT_OUT})")
    ns = p.parse_args(argv)
    only = [k.strip() for k in ns.only.split(",") if k.strip()]
    unknown = [k for k in only if k not in MEASURES]
    if unknown:
        p.error(
            f"--only {ns.only!r}: unknown measure(s) {', '.join(unknown)}; "
            f"expected numbers among {', '.join(MEASURES)}"
        )
    if ns.reps is not None and ns.reps < 1:
        p.error(f"--reps {ns.reps} is invalid: expected an integer >= 1")
    ns.only = only or list(MEASURES)
    ns.reps = ns.reps or (1 if ns.smoke else 5)
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse(argv)
    from benchmarks.contenders import ensure_bytecode

    ensure_bytecode()
    started = harness.machine()
    t0 = time.perf_counter()
    done: dict[str, tuple[str, list[Row]]] = {}
    print(
        f"xrun benchmarks ({'smoke' if ns.smoke else 'full'}, {ns.reps} rep(s)) on "
        f"{started['host']}, {started['cpus']} CPUs, load {started['loadavg'][0]:.2f}",
        flush=True,
    )
    for key in ns.only:
        title, spec = MEASURES[key]
        m0 = time.perf_counter()
        try:
            rows = _load(spec)(ns.reps, ns.smoke)
        except Exception as e:  # noqa: BLE001 - the other measures still run; the row says why
            rows = [Row(title, "s", "-", results={"harness": f"failed: {type(e).__name__}: {e}"})]
        done[key] = (title, rows)
        print(
            harness.render({key: (title, rows)}),
            f"\n  ({time.perf_counter() - m0:.1f} s)",
            flush=True,
        )
        doc = harness.document(
            done, smoke=ns.smoke, reps=ns.reps, wall_s=time.perf_counter() - t0, started=started
        )
        harness.write_json(ns.out, doc)
    failed = [
        f"{key}: {row.label}: {name}"
        for key, (_, rows) in done.items()
        for row in rows
        for name, res in row.results.items()
        if isinstance(res, str) and res.startswith("failed")
    ]
    ours = [f for f in failed if f.split(": ")[-1].startswith(("xrun", "harness"))]
    print(f"\nwrote {ns.out} in {time.perf_counter() - t0:.1f} s")
    if failed:
        print("contenders that failed:\n  " + "\n  ".join(failed), file=sys.stderr)
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
