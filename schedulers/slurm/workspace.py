"""Copy a workspace into a Slurm job's ``job_dir`` so the job is isolated from later edits.

The files are those of the one workspace walk (``schedulers/workspace.py``: any fsspec
filesystem as the source, ``.xrunignore`` or ``.gitignore`` with gitignore semantics, version
control and caches always skipped); the copy lands in ``job_dir``, a local folder the nodes
share.
"""

from __future__ import annotations

import os

from xrun.errors import UsageError

from ..workspace import Workspace, is_ignored, open_workspace, read, walk

__all__ = ["copy_workspace", "is_ignored"]


def copy_workspace(workspace: Workspace | str, job_dir: str) -> list[str]:
    """Copy ``workspace`` to ``job_dir`` (which must not exist or be empty); return the files."""
    ws = open_workspace(workspace) if isinstance(workspace, str) else workspace
    if os.path.isdir(job_dir) and os.listdir(job_dir):
        raise UsageError(
            f"job_dir {job_dir!r} exists and is not empty; each job needs its own: "
            "pass a new path (e.g. with the date in it) or remove the old one"
        )
    copied = []
    for f in walk(ws):
        dst = os.path.join(job_dir, *f.rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as out:
            out.write(read(ws, f))
        os.chmod(dst, f.mode)
        copied.append(f.rel)
    os.makedirs(job_dir, exist_ok=True)
    return copied
