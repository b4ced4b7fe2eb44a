"""torch's file-based watchdog, served by the agent: ``TORCHELASTIC_ENABLE_FILE_TIMER=1``.

* ``server.py``: ``FileTimerServer``, the FIFO's reader, the timers and the kills.

Standard library only; imported only when the variable is set.
"""

from __future__ import annotations

from .server import ENABLE_ENV, FILE_ENV, Expired, FileTimerServer, serve

__all__ = ["ENABLE_ENV", "FILE_ENV", "Expired", "FileTimerServer", "serve"]
