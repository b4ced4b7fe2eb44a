"""A detached watcher for one docker app: gang semantics and clean-up with nobody watching.

Every :meth:`DockerScheduler.describe` reconciles an app (stops the survivors of a failed
replica, keeps the logs, removes containers and network), but without an observer an app that
``xrun run -s docker`` submitted and left would never be reconciled. ``schedule()`` therefore
starts this module in a session of its own (``python -m xrun.schedulers.docker.watch APP_ID
SESSION``, see :func:`.scheduler.start_watcher`): it waits for the app the way
``xrun run --wait`` does, and exits once it is terminal. Several observers are fine:
finalisation is serialised by a file lock.

Only the entry point lives here: the scheduler builds the command line (it imports nothing
from this module) and this module uses the scheduler, so the import goes one way.
"""

from __future__ import annotations

import sys

from .scheduler import DockerScheduler


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m xrun.schedulers.docker.watch APP_ID SESSION", file=sys.stderr)
        return 2
    sched = DockerScheduler(args[1])
    try:
        sched.wait(args[0])
    finally:
        sched.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
