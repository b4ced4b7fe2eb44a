"""The docker scheduler's run options (``-cfg``, ``.xrunconfig [docker]``) as one value.

``runopts(DockerOptions).resolve`` converts and checks what the user gave; the request reads the
typed fields. ``xrun runopts`` and ``xrun configure`` show these fields' types, defaults and help.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xrun.errors import UsageError
from xrun.limits import check_env_name

from ..options import option

# A repository as docker names one: an optional registry host[:port], then lower-case path
# components (letters, digits, single separators . _ __ -), no tag or digest.
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPO = re.compile(rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*")

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

    image_repo: str | None = option(
        "the repository the workspace images are tagged in, as IMAGE_REPO:<hash>, e.g. "
        "registry.example.com:5000/team/ws (TorchX's option); default: xrun-workspace. The "
        "containers run on this engine, so nothing is pushed (nor by TorchX's docker scheduler)"
    )
    quiet: bool = option(
        "print nothing while the workspace image builds (by default each build step goes to "
        "stderr as it runs, as TorchX logs it)",
        default=False,
    )

    def __post_init__(self) -> None:
        for name in self.env:
            check_env_name(name, "run option env")
        if self.image_repo is not None and not _REPO.fullmatch(self.image_repo):
            raise UsageError(
                f"run option image_repo={self.image_repo!r} is not an image repository; "
                "expected [HOST[:PORT]/]NAME[/NAME...] in lower case, no tag (e.g. "
                "registry.example.com:5000/team/ws)"
            )
