"""The docker scheduler's run options (``-cfg``, ``.xrunconfig [docker]``) as one value.

``runopts(DockerOptions).resolve`` converts and checks what the user gave; the request reads the
typed fields. ``xrun runopts`` and ``xrun configure`` show these fields' types, defaults and help.
"""

from __future__ import annotations

from dataclasses import dataclass

from xrun.limits import check_env_name

from ..options import option

# Seconds from a stop's SIGTERM to the engine's SIGKILL, unless the app's stop_timeout says.
STOP_TIMEOUT = 10


@dataclass(frozen=True, kw_only=True)
class DockerOptions:
    copy_env: list[str] = option(
        "glob patterns of the submitting shell's env vars to copy into every container, "
        "e.g. 'WANDB_*;HF_TOKEN'",
        default=[],
    )
    env: dict[str, str] = option("extra env vars for every container, 'K1:V1;K2:V2'", default={})
    shm_size: str = option(
        "size of /dev/shm in every container (docker's own default, 64m, is too small for "
        "PyTorch data loaders)",
        default="1g",
    )
    privileged: bool = option("run the containers privileged", default=False)
    stop_timeout: int = option(
        "seconds between the SIGTERM and the engine's SIGKILL when a replica is stopped "
        "(cancel, or a sibling failed); above the agent's shutdown timeout (30 s) the agent "
        "ends its workers itself; 0 to 86400",
        default=STOP_TIMEOUT,
        seconds=True,
    )

    def __post_init__(self) -> None:
        for name in self.env:
            check_env_name(name, "run option env")
