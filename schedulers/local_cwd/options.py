"""The local_cwd scheduler's run options (``-cfg``, ``.xrunconfig [local_cwd]``) as one value.

``runopts(LocalOptions).resolve`` converts and checks what the user gave; the request reads the
typed fields. ``xrun runopts`` and ``xrun configure`` show these fields' types, defaults and help.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option


@dataclass(frozen=True, kw_only=True)
class LocalOptions:
    log_dir: str | None = option(
        "dir for the apps' logs and state: <log_dir>/<app_id>/<role>/<replica>/"
        "{stdout,stderr}.log; default $XDG_STATE_HOME/xrun/local_cwd/logs "
        "(~/.local/state/xrun/local_cwd/logs)"
    )
    prepend_cwd: bool = option(
        "put the cwd on PATH (after the interpreter's bin dir)", default=False
    )
    auto_set_cuda_visible_devices: bool = option(
        "give each replica its own CUDA_VISIBLE_DEVICES, resource.gpu devices each "
        "(no-op on a host without GPUs)",
        default=False,
    )
    stop_grace_s: float = option(
        "seconds a stopped replica gets between SIGTERM and SIGKILL (on cancel, or when a "
        "sibling fails; after a runtime agent's failure, also before the SIGTERM), 0 to 86400",
        default=10.0,
        seconds=True,
    )
