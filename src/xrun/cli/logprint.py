"""Printing several replicas' logs at once, each line prefixed ``role/replica`` (a sweep's:
``TRIAL/role/replica``; also a single replica's, unless the output is a terminal).

One thread per replica reads :meth:`Runner.log_lines`; a lock keeps lines whole. Colour (one per
replica) only on a terminal and only when NO_COLOR is unset (https://no-color.org).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple, Protocol, TextIO

from xrun.errors import UsageError
from xrun.schedulers.api import LogQuery, Stream

_COLOURS = ("\033[32m", "\033[34m", "\033[35m", "\033[36m", "\033[33m", "\033[31m")
_RESET = "\033[0m"


def colour_enabled(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


class LogSource(Protocol):
    """What the printer reads (a :class:`~xrun.runner.Runner`)."""

    def logs(self, handle: str, query: LogQuery) -> Iterable[str]: ...


class LogTarget(NamedTuple):
    """One replica to print: the app's (or trial's) handle, role, replica, and its label."""

    handle: str
    role: str
    k: int
    label: str


def app_targets(handle: str, roles: dict[str, int], prefix: str = "") -> list[LogTarget]:
    """Every replica of ``roles`` (name -> count), labelled ``[prefix/]role/replica``."""
    return [LogTarget(handle, r, k, f"{prefix}{r}/{k}") for r, n in roles.items() for k in range(n)]


class LogPrinter:
    """Prints the log lines of ``targets`` to ``out``, each reader in a thread of its own."""

    def __init__(
        self,
        runner: LogSource,
        targets: list[LogTarget],
        out: TextIO,
        follow: bool,
        regex: str | None = None,
        streams: Stream | None = None,
        always_prefix: bool = False,
    ) -> None:
        self._runner = runner
        self._targets = targets
        self._out = out
        self._follow = follow
        self._regex = regex
        self._streams = streams
        self._colour = colour_enabled(out)
        # A lone replica's lines are bare only on a terminal; anything read by a program (a
        # file, a pipe) gets `role/replica` on every line, as TorchX prints them.
        isatty = getattr(out, "isatty", None)
        self._prefix = always_prefix or len(targets) > 1 or not (isatty and isatty())
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> None:
        width = max((len(t.label) for t in self._targets), default=0)
        for i, target in enumerate(self._targets):
            label = target.label.ljust(width)
            if self._colour:
                label = f"{_COLOURS[i % len(_COLOURS)]}{label}{_RESET}"
            # Daemon: a scheduler whose tail never ends must not keep the CLI alive.
            t = threading.Thread(target=self._pump, args=(target, label), daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, target: LogTarget, label: str) -> None:
        try:
            query = LogQuery(
                target.role, target.k, self._regex, follow=self._follow, streams=self._streams
            )
            lines = self._runner.logs(target.handle, query)
            for line in lines:
                text = line.rstrip("\n")
                with self._lock:
                    self._out.write(f"{label} {text}\n" if self._prefix else f"{text}\n")
                    self._out.flush()
        except BaseException as e:  # re-raised by join() in the main thread
            self.errors.append(e)

    def join(self, timeout: float | None = None) -> None:
        """Wait for every reader (at most ``timeout`` in all); re-raise a reader's error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(left)
        if self.errors:
            raise self.errors[0]

    def run(self) -> None:
        self.start()
        self.join()


def log_targets(
    what: str, roles: dict[str, int], role: str | None, replicas: list[int] | None
) -> list[tuple[str, int]]:
    """The ``(role, replica)`` pairs of ``xrun log WHAT[/ROLE[/REPLICA,...]]``, checked against
    ``roles`` (name -> replica count); UsageError naming what does not exist."""
    if role is not None and role not in roles:
        raise UsageError(f"{what} has no role {role!r}; roles: {', '.join(roles)}")
    targets: list[tuple[str, int]] = []
    for name, count in roles.items():
        if role is not None and name != role:
            continue
        wanted = replicas if replicas is not None else list(range(count))
        bad = [k for k in wanted if k >= count]
        if bad:
            raise UsageError(
                f"role {name!r} of {what} has replicas 0..{count - 1}; no replica {bad[0]}"
            )
        targets += [(name, k) for k in wanted]
    return targets
