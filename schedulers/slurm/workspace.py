"""Copy a workspace into a Slurm job's ``job_dir`` so the job is isolated from later edits.

The copy goes through fsspec (``file://`` here, but any fsspec URL works as the source) and
skips what an ignore file lists: ``.xrunignore`` if the workspace has one, else ``.gitignore``.
Patterns are the common gitignore subset: ``name``, ``*.ext``, ``dir/``, ``/rooted``,
``a/**/b``, ``#`` comments and ``!negation``. Version control and caches are always skipped.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re

from xrun.errors import UsageError

IGNORE_FILES = (".xrunignore", ".gitignore")
ALWAYS_SKIP = (".git/", ".hg/", "__pycache__/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/")


def read_patterns(workspace: str) -> list[str]:
    """The ignore patterns of ``workspace`` (first ignore file found) plus the fixed ones."""
    patterns = list(ALWAYS_SKIP)
    for name in IGNORE_FILES:
        path = os.path.join(workspace, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.rstrip("\n").rstrip()
                    if line and not line.startswith("#"):
                        patterns.append(line)
            break
    return patterns


def _match_one(pattern: str, rel: str, is_dir: bool) -> bool:
    dir_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    if dir_only and not is_dir:
        return False
    if pattern.startswith("/") or "/" in pattern:
        # Anchored at the workspace root; ** spans directories.
        regex = fnmatch.translate(pattern.lstrip("/")).replace(".*.*", ".*")
        return re.match(regex, rel) is not None
    return fnmatch.fnmatch(posixpath.basename(rel), pattern)


def is_ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """gitignore semantics for the subset above: the last matching pattern wins."""
    ignored = False
    for p in patterns:
        negate = p.startswith("!")
        if _match_one(p[1:] if negate else p, rel, is_dir):
            ignored = not negate
    return ignored


def copy_workspace(workspace: str, job_dir: str) -> list[str]:
    """Copy ``workspace`` to ``job_dir`` (which must not exist or be empty); return the files."""
    import fsspec  # lazy: `import xrun` stays cheap

    src = os.path.abspath(workspace)
    if not os.path.isdir(src):
        raise UsageError(f"workspace {workspace!r} is not a directory; pass the project folder")
    if os.path.isdir(job_dir) and os.listdir(job_dir):
        raise UsageError(
            f"job_dir {job_dir!r} exists and is not empty; each job needs its own: "
            "pass a new path (e.g. with the date in it) or remove the old one"
        )
    patterns = read_patterns(src)
    fs = fsspec.filesystem("file")
    copied = []
    for root, dirs, files in os.walk(src):
        rel_root = os.path.relpath(root, src)
        rel_root = "" if rel_root == "." else rel_root
        dirs[:] = [d for d in dirs if not is_ignored(posixpath.join(rel_root, d), True, patterns)]
        for name in files:
            rel = posixpath.join(rel_root, name)
            if is_ignored(rel, False, patterns):
                continue
            dst = os.path.join(job_dir, rel)
            fs.makedirs(os.path.dirname(dst), exist_ok=True)
            fs.copy(os.path.join(root, name), dst)
            copied.append(rel)
    os.makedirs(job_dir, exist_ok=True)
    return copied
