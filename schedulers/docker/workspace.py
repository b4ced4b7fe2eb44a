"""Build an image that holds the user's workspace and xrun itself, on top of a role's image.

The build context is a tar streamed from here to the engine (nothing is copied on disk, and
the files are read a chunk at a time: memory stays bounded) with two folders:

- ``workspace/``  the workspace's files: the one walk of ``schedulers/workspace.py`` (any
                  fsspec folder; ``.xrunignore`` or ``.gitignore``, gitignore semantics;
                  version control, virtualenvs and caches always left out), as Slurm copies
- ``xrun/``       xrun's own package tree, so ``python3 -m xrun.runtime`` works in an image
                  without pip: the agent is standard-library only; and in ``xrun/_deps/``
                  cloudpickle, for ``xrun.submit``'s worker

The default recipe puts them at ``/workspace`` (the working dir) and ``/opt/xrun`` (on
``PYTHONPATH``). A ``Dockerfile.xrun`` in the workspace replaces the recipe; it sees the same
context and gets the role's image as the build arg ``IMAGE``.

The tag is a hash of the context and the base image, so an unchanged workspace reuses its
image without a build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import io
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xrun.errors import UsageError

from ..workspace import CHUNK, Workspace, WorkspaceFile, open_file, open_workspace, walk
from .request import SHIM_IN_IMAGE, XRUN_DIR

CUSTOM_DOCKERFILE = "Dockerfile.xrun"
IMAGE_REPO = "xrun-workspace"
WORKDIR = "/workspace"

DEFAULT_DOCKERFILE = f"""\
ARG IMAGE
FROM ${{IMAGE}}
COPY xrun {XRUN_DIR}/xrun
# Byte-compiled once here, not at every agent start (~60-80 ms each); a cached layer while
# xrun itself is unchanged. Images without python3 still build (their roles run no agent).
RUN python3 -m compileall -q {XRUN_DIR}/xrun >/dev/null 2>&1 || true
# An image with a TorchX of its own keeps it: the torchx.tracker stand-in, which a role run
# without the agent gets on PYTHONPATH (gap N16; the submitter cannot see what the image holds),
# would shadow it there.
RUN if python3 -c "import torchx" >/dev/null 2>&1; then rm -r {SHIM_IN_IMAGE}/torchx; fi
ENV PYTHONPATH={XRUN_DIR}${{PYTHONPATH:+:${{PYTHONPATH}}}}
COPY workspace {WORKDIR}
WORKDIR {WORKDIR}
"""

# xrun's own package tree (not the user's workspace): byte code stays out.
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")

# The context is read twice (its hash names the image, then it is sent) and sent to the
# engine on every changed build: a workspace this big is almost surely the wrong directory
# (a home dir, a dataset), not code.
MAX_CONTEXT_BYTES = 1 << 30

_XRUN_PACKAGES = ("xrun", "xrun.components", "xrun.schedulers", "xrun.runtime")
# Pure-Python packages the replica side needs beside the standard library, carried under
# xrun/_deps/ (appended to sys.path only when the image has none of its own): cloudpickle,
# which xrun.calls.worker loads a submitted callable with. The caller's own copy, so both
# sides read each other's pickles.
_DEPENDENCIES = ("cloudpickle",)
DEPS_DIR = "_deps"


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
    roots = [(n, n.replace(".", "/")) for n in _XRUN_PACKAGES]
    roots += [(n, f"xrun/{DEPS_DIR}/{n}") for n in _DEPENDENCIES]
    for name, arc_root in roots:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
        for path in _walk(pkg_dir):
            files.setdefault(f"{arc_root}/{path.relative_to(pkg_dir).as_posix()}", path)
    return files


@dataclass(frozen=True)
class BuildContext:
    """The build context, an uncompressed tar, as a stream: :meth:`chunks` reads the files
    again each time, a chunk at a time, so memory stays bounded whatever the workspace holds
    (issue #31 P14: it was one ``io.BytesIO``, about twice the workspace's size in RSS).
    ``digest``, the tar's sha256 from a first pass, names the image; the pass that is sent
    checks it again, so an image never carries other files than its tag says."""

    ws: Workspace
    files: tuple[WorkspaceFile, ...]
    xrun: tuple[tuple[str, Path], ...]  # (name in the tar, path here) of xrun's own files
    default_dockerfile: bool
    digest: str = ""
    size: int = 0

    def chunks(self) -> Iterator[bytes]:
        """The tar, piece by piece; UsageError (at the end, before the last piece) when the
        workspace changed since ``digest`` was taken."""
        h = hashlib.sha256()
        pending = b""
        for chunk in self._tar():
            h.update(chunk)
            if pending:
                yield pending
            pending = chunk
        if self.digest and h.hexdigest() != self.digest:
            raise UsageError(
                f"workspace {self.ws.url!r} changed while its image was built; run again "
                "(or build from a folder nothing writes to: --workspace DIR)"
            )
        yield pending

    def _tar(self) -> Iterator[bytes]:
        total = 0
        for piece in self._members():
            total += len(piece)
            yield piece
        # the end of the archive (two zero blocks), padded to whole records, as tarfile does
        end = 2 * tarfile.BLOCKSIZE
        yield bytes(end + -(total + end) % tarfile.RECORDSIZE)

    def _members(self) -> Iterator[bytes]:
        for f in self.files:
            info = tarfile.TarInfo(f"workspace/{f.rel}")
            info.size, info.mode = f.size, f.mode
            with open_file(self.ws, f) as src:
                yield from _member(info, src, self.ws.url, f.rel)
        for arcname, path in self.xrun:
            st = os.lstat(path)
            info = tarfile.TarInfo(arcname)
            info.mode = st.st_mode & 0o7777
            if stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
                yield from _member(info, None, "xrun", arcname)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                with open(path, "rb") as fh:
                    yield from _member(info, fh, "xrun", arcname)
        if self.default_dockerfile:
            data = DEFAULT_DOCKERFILE.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            yield from _member(info, io.BytesIO(data), "xrun", "Dockerfile")


def _member(info: tarfile.TarInfo, src: Any, where: str, rel: str) -> Iterator[bytes]:
    """One tar member: its header, then ``info.size`` bytes of ``src`` in chunks, padded to
    the block size. Owner and mtime 0: the same files give the same bytes, hence the same tag.
    A file that shrank since its size was read is a UsageError (a grown one gives the bytes
    it had then, as ``tar`` does)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    left = info.size
    while left > 0:
        piece = src.read(min(CHUNK, left))
        if not piece:
            raise UsageError(
                f"{rel!r} in {where} got shorter while the image's build context was read; "
                "run again (or leave files that change out: .xrunignore)"
            )
        left -= len(piece)
        yield piece
    if info.size % tarfile.BLOCKSIZE:
        yield bytes(tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)


def build_context(workspace: Workspace | Path | str) -> tuple[BuildContext, str]:
    """The build context (see :class:`BuildContext`: its digest taken, nothing kept in
    memory) and the Dockerfile's path inside it."""
    ws = workspace if isinstance(workspace, Workspace) else open_workspace(str(workspace))
    files = tuple(walk(ws))
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
    custom = has_custom_dockerfile(files)
    ctx = BuildContext(
        ws, files, tuple(sorted(xrun_package_files().items())), default_dockerfile=not custom
    )
    h, size = hashlib.sha256(), 0
    for chunk in ctx.chunks():
        h.update(chunk)
        size += len(chunk)
    ctx = dataclasses.replace(ctx, digest=h.hexdigest(), size=size)
    return ctx, (f"workspace/{CUSTOM_DOCKERFILE}" if custom else "Dockerfile")


def has_custom_dockerfile(files: Iterable[WorkspaceFile]) -> bool:
    """Whether the workspace's own ``Dockerfile.xrun`` replaces the recipe."""
    return any(f.rel == CUSTOM_DOCKERFILE for f in files)


def image_tag(digest: str, base_image: str, repo: str = IMAGE_REPO) -> str:
    """``REPO:<hash>`` of the context's ``digest`` (:class:`BuildContext`) and the base."""
    tag = hashlib.sha256(base_image.encode() + b"\0" + digest.encode()).hexdigest()[:16]
    return f"{repo}:{tag}"
