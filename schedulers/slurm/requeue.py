"""Whether a Slurm job (or a job array's task) is between two attempts of a requeue.

The batch script writes ``<log dir>/requeued`` just before ``scontrol requeue`` and the next
attempt removes it as it starts (request.py). Meanwhile Slurm may still show the old attempt's
end state for a moment; while the marker is there, status says PENDING instead. A marker can go
stale (the script was killed between the two, or the requeued attempt never started its
script), so it counts for :data:`REQUEUE_WINDOW_S` after it was written only.

Its age is read on one clock: the file server's. The marker's mtime is the server's time (a
compute node wrote it); the reader's "now" is the mtime of a file it creates and removes in
the same folder, also set by the server, never the reader's own clock. A login node whose
clock is a few seconds ahead would otherwise see every requeue as stale (the job FAILED between
two attempts, ``Job.result()`` raising), and one behind would take a stale marker for a
requeue for longer. Only a reader that cannot write there (another account's job, a read-only
mount) falls back to its own clock.
"""

from __future__ import annotations

import os
import time

MARKER = "requeued"
# A requeue shows as the old attempt's end state for a moment; a marker older than this is
# stale (the requeue failed without the batch script noticing).
REQUEUE_WINDOW_S = 10


def requeueing(log_dir: str) -> bool:
    """The batch script asked Slurm to requeue and no new attempt has started yet."""
    try:
        written = os.stat(os.path.join(log_dir, MARKER)).st_mtime
    except OSError:
        return False
    now = _server_now(log_dir)
    return (time.time() if now is None else now) - written < REQUEUE_WINDOW_S


def _server_now(folder: str) -> float | None:
    """The current time on the clock of ``folder``'s file server: the mtime of a file made
    there and touched with no time given (NFS: "set to the server's time"); None when no file
    can be made there."""
    path = os.path.join(folder, f".xrun-now.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.utime(fd)
        return os.fstat(fd).st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
