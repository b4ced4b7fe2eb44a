"""Copy a workspace into a Slurm job's ``job_dir`` so the job is isolated from later edits.

The files are those of the one workspace walk (``schedulers/workspace.py``: any fsspec
filesystem as the source, ``.xrunignore`` or ``.gitignore`` with gitignore semantics, version
control and caches always skipped); the copy lands in ``job_dir``, a local folder the nodes
share.

Each file is copied in chunks (memory stays bounded, whatever the files' sizes), and a copy
that fails (a full disk, no permission) is undone: what it made in ``job_dir`` is removed, so
the next run may use the same ``job_dir``, and the error is one line naming ``job_dir``.
"""

from __future__ import annotations

import errno
import os
import shutil

from xrun.errors import UsageError

from ..workspace import CHUNK, Workspace, is_ignored, open_file, open_workspace, walk

__all__ = ["copy_workspace", "is_ignored"]


def copy_workspace(workspace: Workspace | str, job_dir: str) -> list[str]:
    """Copy ``workspace`` to ``job_dir`` (which must not exist or be empty); return the files."""
    ws = open_workspace(workspace) if isinstance(workspace, str) else workspace
    if os.path.isdir(job_dir) and os.listdir(job_dir):
        raise UsageError(
            f"job_dir {job_dir!r} exists and is not empty; each job needs its own: "
            "pass a new path (e.g. with the date in it) or remove the old one"
        )
    made = _missing_parents(job_dir)  # the folders this copy creates, undone on failure
    copied: list[str] = []
    try:
        os.makedirs(job_dir, exist_ok=True)
        for f in walk(ws):
            dst = os.path.join(job_dir, *f.rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open_file(ws, f) as src, open(dst, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
            os.chmod(dst, f.mode)
            copied.append(f.rel)
    except OSError as e:
        _undo(job_dir, made)
        raise UsageError(_copy_error(e, ws.url, job_dir, len(copied))) from None
    except BaseException:  # an interrupt (Ctrl-C) mid-copy: nothing half-made stays either
        _undo(job_dir, made)
        raise
    return copied


def _missing_parents(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    made: list[str] = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        made.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return made


def _undo(job_dir: str, made: list[str]) -> None:
    """Remove what the copy put in ``job_dir`` (empty before it), then the folders it made."""
    try:
        for name in os.listdir(job_dir):
            path = os.path.join(job_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
    except OSError:
        pass  # job_dir itself was never made
    for path in made:  # deepest first; a folder someone else filled meanwhile stays
        try:
            os.rmdir(path)
        except OSError:
            break


def _copy_error(e: OSError, url: str, job_dir: str, done: int) -> str:
    """The one line for a copy that failed (after ``done`` files)."""
    what = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exhausted",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.EROFS: "the filesystem is read-only",
    }.get(e.errno or 0, e.strerror or str(e))
    at = f" at {e.filename!r}" if e.filename else ""
    return (
        f"job_dir {job_dir!r}: copying workspace {url} failed after {done} files: {what}{at}; "
        "nothing was left there. Free space or pick another -cfg job_dir=DIR (a new folder the "
        "nodes share), or leave big data out of the workspace (.xrunignore)"
    )
