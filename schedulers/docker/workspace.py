"""Build an image that holds the user's workspace and xrun itself, on top of a role's image.

The build context is a tar made here (nothing is copied on disk) with two folders:

- ``workspace/``  the workspace's files: the one walk of ``schedulers/workspace.py`` (any
                  fsspec folder; ``.xrunignore`` or ``.gitignore``, gitignore semantics;
                  version control, virtualenvs and caches always left out), as Slurm copies
- ``xrun/``       xrun's own package tree, so ``python3 -m xrun.runtime`` works in an image
                  without pip: the agent is standard-library only

The default recipe puts them at ``/workspace`` (the working dir) and ``/opt/xrun`` (on
``PYTHONPATH``). A ``Dockerfile.xrun`` in the workspace replaces the recipe; it sees the same
context and gets the role's image as the build arg ``IMAGE``.

The tag is a hash of the context and the base image, so an unchanged workspace reuses its
image without a build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from xrun.errors import UsageError

from ..workspace import Workspace, open_workspace, read, walk

CUSTOM_DOCKERFILE = "Dockerfile.xrun"
IMAGE_REPO = "xrun-workspace"
WORKDIR = "/workspace"

DEFAULT_DOCKERFILE = f"""\
ARG IMAGE
FROM ${{IMAGE}}
COPY xrun /opt/xrun/xrun
# Byte-compiled once here, not at every agent start (~60-80 ms each); a cached layer while
# xrun itself is unchanged. Images without python3 still build (their roles run no agent).
RUN python3 -m compileall -q /opt/xrun/xrun >/dev/null 2>&1 || true
ENV PYTHONPATH=/opt/xrun${{PYTHONPATH:+:${{PYTHONPATH}}}}
COPY workspace {WORKDIR}
WORKDIR {WORKDIR}
"""

# xrun's own package tree (not the user's workspace): byte code stays out.
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")

# The context is built in memory and sent to the engine on every changed build: a workspace
# this big is almost surely the wrong directory (a home dir, a dataset), not code.
MAX_CONTEXT_BYTES = 1 << 30

_XRUN_PACKAGES = ("xrun", "xrun.components", "xrun.schedulers", "xrun.runtime")


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")
        )
        for name in sorted(filenames):
            if not name.endswith(_SKIP_SUFFIXES):
                yield Path(dirpath) / name


def xrun_package_files() -> dict[str, Path]:
    """``{"xrun/runtime/agent.py": path, ...}`` for xrun as installed (editable or not).

    Each package is located by itself (``find_spec``, which executes nothing): in a checkout
    the sub-packages are symlinked folders, which the walk does not follow.
    """
    files: dict[str, Path] = {}
    for name in _XRUN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
        arc_root = name.replace(".", "/")
        for path in _walk(pkg_dir):
            files.setdefault(f"{arc_root}/{path.relative_to(pkg_dir).as_posix()}", path)
    return files


def build_context(workspace: Workspace | Path | str) -> tuple[bytes, str]:
    """The build context (an uncompressed tar) and the Dockerfile's path inside it."""
    ws = workspace if isinstance(workspace, Workspace) else open_workspace(str(workspace))
    files = list(walk(ws))
    total = 0
    for f in files:  # every size first: a huge workspace is refused before reading any of it
        total += f.size
        if total > MAX_CONTEXT_BYTES:
            raise UsageError(
                f"workspace {ws.url!r} holds more than {MAX_CONTEXT_BYTES >> 20} MiB "
                f"(reached at {f.rel!r}); the docker scheduler copies the workspace into an "
                f"image, so pass --workspace DIR with just the code (data belongs in a mount: "
                f"--mounts type=bind,src=...,dst=...), or list the data in .xrunignore"
            )
    entries: dict[str, Path] = {}
    entries.update(xrun_package_files())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in files:
            data = read(ws, f)
            info = tarfile.TarInfo(f"workspace/{f.rel}")
            info.size, info.mode = len(data), f.mode  # owner and mtime 0: see below
            tar.addfile(info, io.BytesIO(data))
        for arcname in sorted(entries):
            path = entries[arcname]
            info = tar.gettarinfo(str(path), arcname)
            # Fixed owner/mtime: the same files give the same bytes, hence the same tag.
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isreg():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            elif info.issym():
                tar.addfile(info)
        if any(f.rel == CUSTOM_DOCKERFILE for f in files):
            dockerfile = f"workspace/{CUSTOM_DOCKERFILE}"
        else:
            dockerfile = "Dockerfile"
            data = DEFAULT_DOCKERFILE.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), dockerfile


def image_tag(context: bytes, base_image: str, repo: str = IMAGE_REPO) -> str:
    digest = hashlib.sha256(base_image.encode() + b"\0" + context).hexdigest()[:16]
    return f"{repo}:{digest}"
