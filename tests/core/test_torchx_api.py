"""TorchX 0.7.0's behaviours that code ported from TorchX relies on: the handle API.

The expected values come from TorchX 0.7.0's sources (torchx/specs/builders.py, api.py).
"""

from __future__ import annotations

import pytest

from xrun.errors import UsageError
from xrun.specs import ParsedAppHandle, make_app_handle, parse_app_handle


# --------------------------------------------------------------------------- handles
def test_make_app_handle_takes_torchx_argument_order() -> None:
    # TorchX: make_app_handle(scheduler_backend, session_name, app_id)
    assert make_app_handle("slurm", "me", "1234") == "slurm://me/1234"


def test_parse_app_handle_unpacks_like_torchx() -> None:
    scheduler, session, app_id = parse_app_handle("local_cwd://default/ddp-x1")
    assert (scheduler, session, app_id) == ("local_cwd", "default", "ddp-x1")
    parsed = parse_app_handle("slurm:///42")
    assert isinstance(parsed, ParsedAppHandle) and isinstance(parsed, tuple)
    assert parsed.scheduler_backend == "slurm" and parsed.session_name == ""
    assert parsed.app_id == "42"
    with pytest.raises(UsageError, match="malformed app handle"):
        parse_app_handle("nope")
