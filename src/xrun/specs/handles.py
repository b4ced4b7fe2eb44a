"""``scheduler://session/app_id``: how every command after ``run`` finds a job (and TorchX's
``make_app_handle``/``parse_app_handle`` over it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from xrun.errors import UsageError

# --------------------------------------------------------------------------- handles
_HANDLE_FORM = "SCHEDULER://SESSION/APP_ID (e.g. local_cwd://default/ddp-x1y2z3)"
_HANDLE_RE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)://([A-Za-z0-9_.-]*)/([^/\s]+)$")


@dataclass(frozen=True)
class AppHandle:
    """``scheduler://session/app_id``: how every command after ``run`` finds a job."""

    scheduler: str
    session: str
    app_id: str

    @staticmethod
    def parse(text: str) -> AppHandle:
        m = _HANDLE_RE.match(text.strip())
        if not m:
            raise UsageError(f"malformed app handle {text!r}; expected {_HANDLE_FORM}")
        return AppHandle(m.group(1), m.group(2), m.group(3))

    def __str__(self) -> str:
        return f"{self.scheduler}://{self.session}/{self.app_id}"


class ParsedAppHandle(NamedTuple):
    """A handle's three parts, named and ordered as TorchX's (``scheduler, session, app_id =
    parse_app_handle(h)`` works)."""

    scheduler_backend: str
    session_name: str
    app_id: str


def make_app_handle(scheduler_backend: str, session_name: str, app_id: str) -> str:
    """``scheduler_backend://session_name/app_id``: TorchX's function, in TorchX's argument
    order, so that code ported from TorchX builds the same handle."""
    return str(AppHandle(scheduler_backend, session_name, app_id))


def parse_app_handle(text: str) -> ParsedAppHandle:
    """The parts of a handle as a 3-tuple (TorchX's ``ParsedAppHandle``); UsageError if
    malformed."""
    h = AppHandle.parse(text)
    return ParsedAppHandle(h.scheduler, h.session, h.app_id)
