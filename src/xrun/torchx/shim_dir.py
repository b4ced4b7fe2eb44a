"""Where xrun's worker-side ``torchx.tracker`` stand-in lives (``xrun/torchx/shim``), for the
roles a scheduler starts without xrun's runtime agent (``utils.python``, ``utils.sh``, ...):
their script's ``from torchx.tracker import app_run_from_env`` (TorchX's documented pattern)
works unchanged when TorchX is not installed. The agent does the same for its own workers
(``xrun.runtime.config.torchx_shim_path``). Light on purpose: the schedulers' request
builders import it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

from xrun.contract import JOB_ID_ENV

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")


def _torchx_importable() -> bool:
    mod = sys.modules.get("torchx")
    if mod is not None:  # the real one, or xrun's stand-ins (a TorchX file being loaded)
        return not getattr(mod, "__xrun_stand_in__", False)
    spec = importlib.util.find_spec("torchx")
    return spec is not None and not (spec.origin or "").startswith(SHIM)


def role_shim(role_env: Mapping[str, str]) -> str | None:
    """The folder to append to a role's ``PYTHONPATH``: for the roles of a job xrun
    submitted (``TORCHX_JOB_ID`` in their env) while TorchX is not importable here."""
    if JOB_ID_ENV not in role_env or _torchx_importable():
        return None
    return SHIM
