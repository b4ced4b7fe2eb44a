"""``@record`` and ``ErrorHandler``: how a process writes its own error file.

As torch's: an uncaught exception is written to ``$TORCHELASTIC_ERROR_FILE`` and re-raised;
a ``ChildFailedError`` (the agent's own failure, raised by ``launch``) writes no file of its
own but copies the root cause's error file with ``errorCode`` set to that worker's exit code,
and writes nothing when the root cause left none.

Standard library only: a function worker imports this before the user's code runs.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .files import ERROR_FILE_ENV, write_error_file

__all__ = ["ErrorHandler", "record"]

_R = TypeVar("_R")


class ErrorHandler:
    """Writes this process's error file (torch's ``ErrorHandler``, same methods). ``@record``
    sets ``_fn_name`` (the entrypoint's qualified name, None for a partial) before
    ``initialize`` and calls ``record_success`` when the function returns, as newer torch
    does, so a subclass may report either."""

    _fn_name: str | None = None

    def record_success(self) -> None:
        """The decorated function returned (nothing to write)."""

    def initialize(self) -> None:
        """Dump every thread's Python stack on a fatal signal (segfault, SIGABRT)."""
        import faulthandler  # benchmark 1: only @record arms it; never the agent

        try:
            faulthandler.enable(all_threads=True)
        except (OSError, ValueError, RuntimeError):  # stderr closed or not a real file
            pass

    def _error_file_path(self) -> str | None:
        return os.environ.get(ERROR_FILE_ENV) or None

    def record_exception(self, e: BaseException) -> None:
        """Write ``e`` with its traceback to ``$TORCHELASTIC_ERROR_FILE`` (nothing when unset)."""
        path = self._error_file_path()
        if path:
            write_error_file(path, e)

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy a worker's error file to this process's, with ``errorCode`` = ``error_code``."""
        with open(rootcause_error_file, encoding="utf-8", errors="replace") as fp:
            doc = json.load(fp)
        message = doc.get("message") if isinstance(doc, dict) else None
        if error_code and isinstance(message, dict):
            message["errorCode"] = error_code
        path = self._error_file_path()
        if not path:
            print(json.dumps(doc), file=sys.stderr)  # torch logs it when there is no file
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        # 0600: the worker's traceback may quote data meant for the user alone.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fp:
            json.dump(doc, fp)
        os.replace(tmp, path)


def record(
    fn: Callable[..., _R], error_handler: ErrorHandler | None = None
) -> Callable[..., _R | None]:
    """Decorate a worker's (or a launcher's) main function: an uncaught exception is written
    to ``$TORCHELASTIC_ERROR_FILE`` (when set) and re-raised, so the process still fails.

    Like torch's ``@record``: ``SystemExit(0)`` returns None (``runpy``-style mains end that
    way); other ``SystemExit`` codes pass through unrecorded, their exit code says it all; a
    ``ChildFailedError`` copies its root cause's error file (if it has one) and is re-raised.
    Example::

        from xrun.runtime import record

        @record
        def main() -> None:
            ...

        if __name__ == "__main__":
            main()
    """
    handler = error_handler or ErrorHandler()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _R | None:
        handler._fn_name = getattr(fn, "__qualname__", None)
        handler.initialize()
        try:
            result = fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 0:
                return None
            raise
        except Exception as exc:
            first = getattr(exc, "get_first_failure", None)  # a ChildFailedError, ours or torch's
            if first is None:
                handler.record_exception(exc)
            else:
                _, failure = first()
                if failure.error_file not in ("", "<N/A>", None):
                    handler.dump_error_file(failure.error_file, failure.exitcode)
            raise
        handler.record_success()  # outside the try: its own error is no failure of fn
        return result

    return wrapper
