"""Loggers that import ``logging`` on first use.

``logging`` (with ``traceback`` and ``textwrap`` behind it) takes a few milliseconds to import,
and the runtime logs only when something goes wrong (a dropped client, a failed heartbeat): an
agent whose job goes well never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging  # benchmark 1: logging (a few ms) only once something is logged

__all__ = ["LazyLogger"]


class LazyLogger:
    """``logging.getLogger(name)``, fetched by the first call. The calls report their caller's
    file and line, as the logger's own would."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: logging.Logger | None = None

    def _get(self) -> logging.Logger:
        if self._logger is None:
            import logging  # benchmark 1: logging (a few ms) only once something is logged

            self._logger = logging.getLogger(self._name)
        return self._logger

    # stacklevel=2: the record names the caller of these methods, not this module. A log call
    # never raises: they sit in error paths (a failed accept when file descriptors run out,
    # where even importing ``logging`` may fail), and must not turn one error into a crash.
    def debug(self, msg: str, *args: object) -> None:
        try:
            self._get().debug(msg, *args, stacklevel=2)
        except Exception:  # noqa: BLE001, S110 - see above
            pass

    def info(self, msg: str, *args: object) -> None:
        try:
            self._get().info(msg, *args, stacklevel=2)
        except Exception:  # noqa: BLE001, S110 - see above
            pass

    def warning(self, msg: str, *args: object) -> None:
        try:
            self._get().warning(msg, *args, stacklevel=2)
        except Exception:  # noqa: BLE001, S110 - see above
            pass

    def exception(self, msg: str, *args: object) -> None:
        try:
            self._get().exception(msg, *args, stacklevel=2)
        except Exception:  # noqa: BLE001, S110 - see above
            pass
