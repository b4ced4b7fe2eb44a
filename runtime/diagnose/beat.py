"""A worker's progress beat for the agent's stall watchdog (``--stall-timeout``)::

    from xrun.runtime.diagnose.beat import beat
    for step in range(steps):
        train_step()
        beat()

A line of output counts as progress too; a beat is for a worker that works silently. It
touches the file the agent names in ``$XRUN_BEAT_FILE`` (nothing when that is unset: the script
runs unchanged under torchrun), at most twice a second, so it may be called every step.
Standard library only, nothing heavy imported: a worker pays microseconds.
"""

from __future__ import annotations

import os
import time

from xrun.contract import BEAT_FILE_ENV

__all__ = ["beat"]

# Coarser than any sensible --stall-timeout; finer calls would only cost syscalls.
_MIN_PERIOD_S = 0.5
_last = 0.0


def beat() -> None:
    """Tell the agent this worker made progress (a no-op outside an xrun agent)."""
    global _last
    now = time.monotonic()
    if now - _last < _MIN_PERIOD_S:
        return
    _last = now
    path = os.environ.get(BEAT_FILE_ENV)
    if not path:
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError:
            pass  # the agent's dir is gone (it is stopping us): nothing to tell
    except OSError:
        pass
