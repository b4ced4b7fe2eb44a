"""Build an image that holds the user's workspace and xrun itself, on top of a role's image.

The build context is a tar made here (nothing is copied on disk) with two folders:

- ``workspace/``  the workspace (``.git``, virtualenvs and caches left out)
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

# Never part of a job's code, often large: version control, virtualenvs, caches.
_SKIP_DIRS = {
    ".git",
    ".hg",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "node_modules",
    ".tox",
    ".eggs",
}
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


def build_context(workspace: Path) -> tuple[bytes, str]:
    """The build context (an uncompressed tar) and the Dockerfile's path inside it."""
    if not workspace.is_dir():
        raise UsageError(
            f"workspace {str(workspace)!r} is not a directory; pass --workspace DIR (the code the "
            f"job runs) or leave it out to use the current directory"
        )
    entries: dict[str, Path] = {}
    total = 0
    for p in _walk(workspace):
        entries[f"workspace/{p.relative_to(workspace).as_posix()}"] = p
        total += p.lstat().st_size
        if total > MAX_CONTEXT_BYTES:
            raise UsageError(
                f"workspace {str(workspace)!r} holds more than {MAX_CONTEXT_BYTES >> 20} MiB "
                f"(reached at {str(p)!r}); the docker scheduler copies the workspace into an "
                f"image, so pass --workspace DIR with just the code (data belongs in a mount: "
                f"--mounts type=bind,src=...,dst=...)"
            )
    entries.update(xrun_package_files())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname in sorted(entries):
            path = entries[arcname]
            info = tar.gettarinfo(str(path), arcname)
            # Fixed owner/mtime: the same files give the same bytes, hence the same tag.
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            elif info.issym():
                tar.addfile(info)
        custom = workspace / CUSTOM_DOCKERFILE
        if custom.is_file():
            dockerfile = f"workspace/{CUSTOM_DOCKERFILE}"
        else:
            dockerfile = "Dockerfile"
            data = DEFAULT_DOCKERFILE.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), dockerfile


def image_tag(context: bytes, base_image: str) -> str:
    digest = hashlib.sha256(base_image.encode() + b"\0" + context).hexdigest()[:16]
    return f"{IMAGE_REPO}:{digest}"
