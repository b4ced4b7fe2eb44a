"""A detached watcher for one docker app: gang semantics and clean-up with nobody watching.

Every :meth:`DockerScheduler.describe` reconciles an app (stops the survivors of a failed
replica, keeps the logs, removes containers and network), but without an observer an app that
``xrun run -s docker`` submitted and left would never be reconciled. ``schedule()`` therefore
starts this module in a session of its own (``python -m xrun.schedulers.docker_watch APP_ID
SESSION``): it waits for the app the way ``xrun run --wait`` does, and exits once it is terminal.
Several observers are fine: finalisation is serialised by a file lock.
"""

from __future__ import annotations

import os
import subprocess
import sys


def start(app_id: str, session: str) -> None:
    """Start the watcher for ``app_id``, detached (it outlives the CLI that submitted)."""
    subprocess.Popen(
        [sys.executable, "-m", "xrun.schedulers.docker_watch", app_id, session],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=os.environ.copy(),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m xrun.schedulers.docker_watch APP_ID SESSION", file=sys.stderr)
        return 2
    from xrun.schedulers.docker import DockerScheduler

    sched = DockerScheduler(args[1])
    try:
        sched.wait(args[0])
    finally:
        sched.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
