"""A workspace: the folder of code a job runs, on any fsspec filesystem, walked ONE way.

The docker scheduler (the image's build context, ``docker/workspace.py``) and the Slurm
scheduler (the ``job_dir`` copy, ``slurm/workspace.py``) both take the files from
:func:`walk`, with one ignore rule, so the same workspace gives the same files on both:

- **where**: a local path, a ``file://`` URL, ``memory://NAME``, or any fsspec URL whose
  filesystem is installed (``s3://…`` with s3fs, ...).
- **the patterns**: ``.xrunignore`` at the workspace's top if it has one, else its
  ``.gitignore`` (one file, the top level's; nested ignore files are ordinary files), after
  :data:`ALWAYS_SKIP` (version control, virtualenvs, caches), so a ``!pattern`` there can take
  one of those back.
- **the semantics**: gitignore's, the common subset: ``name`` and ``*.ext`` match at any depth,
  ``dir/`` only folders, ``/rooted`` and ``a/b`` are anchored at the top, ``**`` spans folders,
  ``#`` comments, ``!negation``; the last matching pattern wins, and an ignored folder's
  contents are never looked at.

Why gitignore and not ``.dockerignore``: most projects already keep a ``.gitignore`` naming
what is not code (virtualenvs, data, outputs, checkpoints), and its unanchored ``name`` is what
people expect to match at any depth (``.dockerignore`` anchors every pattern at the top).

A :class:`Workspace` is opened once, at the edge (``Runner.dryrun``/``run``, through the
scheduler's :meth:`~xrun.schedulers.api.Scheduler.open_workspace`), and the value travels into
the request: the dry run prints its :meth:`~Workspace.describe_ignored`, and submit walks (Slurm:
copies, docker: builds) the same value, so ``--dryrun`` shows exactly the folder and the ignore
set that submit uses. None means "no workspace" wherever a workspace is passed. fsspec is
imported only here, when a URL is opened or a local folder first walked (``import xrun``, a
local_cwd dry run and a Slurm dry run that runs in a plain folder never do: benchmark 5).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from xrun.errors import UsageError

IGNORE_FILES = (".xrunignore", ".gitignore")
# Never a job's code, often large: version control, virtualenvs, caches, byte code.
ALWAYS_SKIP = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "__pycache__/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".tox/",
    ".eggs/",
    "*.egg-info/",
    "node_modules/",
    "*.pyc",
    "*.pyo",
)
EXPECTED = (
    "a folder: a local path, file:///ABS/PATH, memory://NAME or a URL of an installed fsspec "
    "filesystem"
)


@dataclass(frozen=True)
class WorkspaceFile:
    rel: str  # the path below the workspace, '/'-separated
    path: str  # the path on the workspace's filesystem
    size: int
    mode: int  # permission bits (0o644 where the filesystem keeps none)


@dataclass(frozen=True)
class Workspace:
    """One opened workspace: where it is and the ignore set that every walk of it uses."""

    url: str  # as shown and recorded: an absolute local path, or the URL as given
    root: str  # the folder's path on ``fs``
    ignore_file: str | None  # the ignore file the user's patterns came from
    patterns: tuple[str, ...]  # ALWAYS_SKIP, then the ignore file's
    # The fsspec filesystem; None for a plain local path until a walk needs it (see
    # :func:`filesystem`): opening one imports no fsspec.
    fs: Any = field(default=None, compare=False, repr=False)
    given: str = field(default="", compare=False)  # as the user wrote it (their messages)

    def user_patterns(self) -> tuple[str, ...]:
        return self.patterns[len(ALWAYS_SKIP) :]

    def describe_ignored(self) -> str:
        """One line: the ignore set (what ``--dryrun`` prints under the workspace's URL)."""
        own = (
            f"{self.ignore_file}: {' '.join(self.user_patterns()) or '(no patterns)'}"
            if self.ignore_file
            else f"(no {' or '.join(IGNORE_FILES)})"
        )
        return f"leaving out {own}; always: {' '.join(ALWAYS_SKIP)}"

    def local_path(self) -> str | None:
        """The folder as a local path, when it is one (a plain path or ``file://``)."""
        if self.fs is None:
            return self.root
        protocol = getattr(self.fs, "protocol", None)
        names = protocol if isinstance(protocol, tuple) else (protocol,)
        return self.root if "file" in names else None


def filesystem(ws: Workspace) -> Any:
    """``ws``'s fsspec filesystem, made on first use for a plain local path."""
    if ws.fs is None:
        from fsspec.implementations.local import LocalFileSystem  # lazy: see the module doc

        object.__setattr__(ws, "fs", LocalFileSystem())  # a cache: equality ignores fs
    return ws.fs


def _filesystem(spec: str) -> tuple[Any, str, str]:
    """(fs, root, url) for an fsspec URL."""
    import fsspec  # lazy: see the module's docstring

    try:
        fs, root = fsspec.core.url_to_fs(spec)
    except (ValueError, ImportError) as e:  # an unknown protocol, a filesystem not installed
        raise UsageError(f"workspace {spec!r}: {e}; pass {EXPECTED}") from None
    return fs, root, spec


def open_workspace(spec: str) -> Workspace:
    """The workspace ``spec`` names, its ignore file read; UsageError unless it is a folder."""
    if not spec:
        raise UsageError(f"an empty workspace; pass {EXPECTED}")
    if "://" not in spec:  # a plain path: the os module answers, fsspec waits for a walk
        root = os.path.abspath(spec)
        check_local_dir(spec, root)
        fs, url = None, root
        is_file, read = os.path.isfile, _read_local
    else:
        fs, root, url = _filesystem(spec)
        try:
            is_dir = fs.isdir(root)
        except OSError as e:
            raise UsageError(f"workspace {spec!r} cannot be read ({e}); pass {EXPECTED}") from None
        if not is_dir:
            raise UsageError(f"workspace {spec!r} is not a directory; pass {EXPECTED}")
        is_file, read = fs.isfile, fs.cat_file
    patterns = list(ALWAYS_SKIP)
    used = None
    for name in IGNORE_FILES:
        path = posixpath.join(root, name)
        if is_file(path):
            text = read(path).decode("utf-8", errors="replace")
            patterns += [
                ln.rstrip()
                for ln in text.splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")
            ]
            used = name
            break
    return Workspace(url, root, used, tuple(patterns), fs, spec)


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def as_workspace(given: Workspace | str | None) -> Workspace | None:
    """``given`` opened (a string), as it is (a value), or None for none (None or ``""``)."""
    if isinstance(given, Workspace):
        return given
    return open_workspace(given) if given else None


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


def is_ignored(rel: str, is_dir: bool, patterns: tuple[str, ...] | list[str]) -> bool:
    """gitignore semantics for the subset above: the last matching pattern wins."""
    ignored = False
    for p in patterns:
        negate = p.startswith("!")
        if _match_one(p[1:] if negate else p, rel, is_dir):
            ignored = not negate
    return ignored


def walk(ws: Workspace) -> Iterator[WorkspaceFile]:
    """Every file of ``ws`` that the ignore set keeps, sorted by ``rel``. A linked folder is
    not followed (a link to a file is read as the file): a link loop cannot walk forever."""
    stack = [("", ws.root)]
    found: list[WorkspaceFile] = []
    while stack:
        rel_dir, path = stack.pop()
        for entry in filesystem(ws).ls(path, detail=True):
            name = posixpath.basename(str(entry["name"]).rstrip("/"))
            rel = f"{rel_dir}/{name}" if rel_dir else name
            is_dir = entry.get("type") == "directory"
            if is_ignored(rel, is_dir, ws.patterns):
                continue
            if is_dir:
                if not entry.get("islink"):
                    stack.append((rel, entry["name"]))
            elif entry.get("type") == "file":
                mode = int(entry.get("mode") or 0o644) & 0o777
                found.append(WorkspaceFile(rel, entry["name"], int(entry.get("size") or 0), mode))
    return iter(sorted(found, key=lambda f: f.rel))


# Files are copied in pieces of this size: memory stays bounded whatever the workspace holds
# (a 10 GB checkpoint beside the code; issue #31 P14).
CHUNK = 1 << 20


def open_file(ws: Workspace, f: WorkspaceFile) -> Any:
    """``f`` opened for reading in chunks (a binary file object of the workspace's fs)."""
    return filesystem(ws).open(f.path, "rb")


def check_local_dir(given: str, path: str) -> None:
    """UsageError unless ``path`` (the workspace ``given``, as a local path) is a folder a job
    can run in: an existing directory, not in the kernel's pseudo-filesystems (``/proc/self/fd``
    names another folder on every node and process)."""
    if not os.path.isdir(path):
        raise UsageError(f"workspace {given!r} is not a directory; pass {EXPECTED}")
    real = os.path.realpath(path)
    if any(real == top or real.startswith(top + "/") for top in ("/proc", "/sys", "/dev")):
        raise UsageError(
            f"workspace {given!r} is in the kernel's {real.split('/')[1]} filesystem ({real}), "
            f"no folder of code; pass {EXPECTED}"
        )


def script_rel(script: object) -> str | None:
    """A role's ``--script`` as a path below the folder the job runs in, when xrun can check
    it: None for a macro (known in the replica only), an absolute path (in the image, or on
    the nodes) and a path that leaves the folder (``../x.py``)."""
    if not isinstance(script, str) or not script or "$" in script or os.path.isabs(script):
        return None
    rel = posixpath.normpath(script.replace(os.sep, "/"))
    return None if rel == ".." or rel.startswith("../") or rel == "." else rel


def script_problem(ws: Workspace, rel: str) -> str | None:
    """Why ``rel`` (see :func:`script_rel`) is not among the files a walk of ``ws`` gives (None
    when it is): no such file, or a pattern of the ignore set leaves it (or a folder above it)
    out."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        below = "/".join(parts[:i])
        if is_ignored(below, i < len(parts), ws.patterns):
            src = ws.ignore_file or "the always-skipped set"
            return f"is left out of the workspace by {src} ({below!r} matches)"
    try:
        if filesystem(ws).isfile(posixpath.join(ws.root, rel)):
            return None
    except OSError as e:
        return f"cannot be read in workspace {ws.url} ({e})"
    return f"is no file in workspace {ws.url}"


def check_scripts(app: Any, ws: Workspace, why: str, outside: str) -> None:
    """UsageError naming the first role whose ``--script`` the job will not find in ``ws``
    (the copy it runs in; ``why`` says that in the message), as local_cwd checks its cwd: a
    missing script would otherwise only fail as the app, on the cluster (N11). ``outside``:
    where an absolute path is looked for instead (not checked)."""
    from xrun.contract import SCRIPT

    for role in app.roles:
        script = (role.metadata or {}).get(SCRIPT)
        rel = script_rel(script)
        if rel is None:
            continue
        problem = script_problem(ws, rel)
        if problem is not None:
            raise UsageError(
                f"role {role.name!r}: --script {script!r} {problem} ({why}); give a script "
                f"inside the workspace, or an absolute path for one that is already {outside}"
            )
