"""A worker that records the signals it gets, for the signal tests (standard library only).

Usage: sigterm_worker.py MARK_DIR [--stubborn RANK,...]

Every worker (global rank R, from the env the runtime agent sets) writes, in MARK_DIR:

  R.ready   its pid, once its SIGTERM handler is installed (the test waits for all of them)
  R.term    the time.time() at which the first SIGTERM arrived
  R.alive   the time.time() of its latest heartbeat, rewritten every 0.05 s until it dies: the
            test reads how long a stubborn worker lived after SIGTERM, even when the worker ran
            in a container whose pids the host cannot see

An obedient worker exits 0 on SIGTERM. A stubborn one (its rank listed in --stubborn) records
SIGTERM and keeps running, so only SIGKILL ends it: the escalation path under test.
Every write is a rename of a finished temp file, so the test never reads half a record.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType


def write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("marks", help="directory for the marker files")
    parser.add_argument("--stubborn", default="", help="ranks that ignore SIGTERM, e.g. 1,3")
    args = parser.parse_args()
    rank = os.environ["RANK"]
    stubborn = rank in args.stubborn.split(",")
    base = os.path.join(args.marks, rank)

    first_term: list[float] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        # Only notes the time of the FIRST SIGTERM; the loop below writes it. Two often arrive
        # together (Slurm's slurmstepd and the agent both send one), and a handler doing I/O
        # could run again inside its own write and break it.
        if not first_term:
            first_term.append(time.time())

    signal.signal(signal.SIGTERM, on_term)
    write(base + ".ready", str(os.getpid()))
    recorded = False
    while True:
        if first_term and not recorded:
            write(base + ".term", repr(first_term[0]))
            recorded = True
            if not stubborn:
                sys.exit(0)
        write(base + ".alive", repr(time.time()))
        time.sleep(0.05)


if __name__ == "__main__":
    main()
