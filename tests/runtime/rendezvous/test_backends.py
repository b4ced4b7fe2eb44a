"""The rendezvous handler is an interface: the backends are its siblings, the agent uses nothing
else, and ``create_handler`` loads only the backend a job runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import xrun.runtime
from xrun.contract import RDZV_BACKENDS
from xrun.runtime.rendezvous import RendezvousHandler, api
from xrun.runtime.rendezvous.backends import BACKENDS
from xrun.runtime.rendezvous.etcd import EtcdRendezvousHandler
from xrun.runtime.rendezvous.handler import StoreRendezvousHandler


def test_the_handler_is_an_abstract_interface() -> None:
    assert RendezvousHandler.__module__ == api.__name__
    assert RendezvousHandler.__abstractmethods__ >= {
        "next_rendezvous",
        "fileno",
        "poll_event",
        "closed_failed",
        "request_restart",
        "close",
        "finish",
        "kv",
        "shutdown",
        "workers_address",
    }


def test_the_backends_are_siblings() -> None:
    """etcd's handler inherits the interface only, none of the store handler's private state
    or methods (the review's R13: it used to subclass it and skip its ``__init__``)."""
    for cls in (StoreRendezvousHandler, EtcdRendezvousHandler):
        # the interface, after at most a part of the backend's own kept in a module of its
        # own for size (etcd_leave.EtcdLeaving), which has no state or __init__ of its own
        between = cls.__mro__[1 : cls.__mro__.index(RendezvousHandler)]
        assert all(
            c.__module__.startswith(cls.__module__) and "__init__" not in vars(c) for c in between
        ), between
        assert not cls.__abstractmethods__
    assert not issubclass(EtcdRendezvousHandler, StoreRendezvousHandler)
    assert not issubclass(StoreRendezvousHandler, EtcdRendezvousHandler)


def test_the_table_names_every_backend_the_contract_names() -> None:
    assert tuple(BACKENDS) == RDZV_BACKENDS


def test_the_agent_uses_only_the_interface() -> None:
    """Every attribute the agent reads on its handler is declared by ``RendezvousHandler``, and
    none is probed with ``getattr`` (the agent cannot tell the backends apart)."""
    source = (Path(xrun.runtime.__path__[0]) / "agent.py").read_text()
    used = set(re.findall(r"\bhandler\.([A-Za-z_]\w*)", source))
    assert used, "the agent's handler calls were not found"
    declared = set(dir(RendezvousHandler)) | set(RendezvousHandler.__annotations__)
    assert not sorted(used - declared)
    assert "getattr(handler" not in source


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return set(out.split())


def test_each_backend_is_imported_on_first_use_only() -> None:
    """Importing the rendezvous loads no backend; a c10d handler loads the store backend and
    not etcd's (``http.client``, ``ssl``), as torch's registry does."""
    pkg = "xrun.runtime.rendezvous"
    bare = _modules_after(f"import {pkg}")
    assert f"{pkg}.handler" not in bare and f"{pkg}.etcd" not in bare
    used = _modules_after(
        f"from {pkg} import Endpoint, RendezvousParams, create_handler\n"
        f"h = create_handler(RendezvousParams('c10d', Endpoint('127.0.0.1', 0), 'j', 1, 1, 1, {{}}))\n"
        f"h.shutdown()"
    )
    assert f"{pkg}.handler" in used and f"{pkg}.etcd" not in used
