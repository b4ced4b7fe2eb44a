"""The ``fsspec`` tracker backend: runs as files under one root, in TorchX 0.7.0's layout.

The layout (TorchX's ``FsspecTracker``; ``torchx tracker list`` reads what xrun writes and the
other way round, checked by tests/core/tracker/test_torchx_layout.py)::

    ROOT/<b32(run_id)>/metadata/<entry>       {"metadata": {...}}, merged in time order
    ROOT/<b32(run_id)>/artifacts/<entry>      {"name": N, "path": P, "metadata": M}
    ROOT/<b32(run_id)>/sources/<b32(source)>  the relation (artifact name) and a newline
    ROOT/<b32(source)>/descendants/<b32(run)> likewise, only when that dir already exists

An ``<entry>`` is named ``<time_ns>-<pid>-<random hex>``: entries sort by the time before the
first ``-``. TorchX names them by ``time_ns`` alone (still read, in the same order), but two
writers can read the same ``time_ns`` (a coarse clock on a VM or in a container), and the
later write would replace the other's entry; TorchX reads any name.

``b32`` is base32 of the ASCII id: a run id (``local_cwd://default/app``) becomes a POSIX file
name that keeps its case. A local root (a path, ``file://``) is written with ``os`` directly:
``import fsspec`` would cost a worker more than the whole tracker; any other URL goes through
fsspec.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import stat
import time
from base64 import b32decode, b32encode
from collections.abc import Mapping
from typing import Any

from xrun.errors import UsageError
from xrun.tracker.base import Lineage, TrackerArtifact, TrackerBase, TrackerSource


def encode_run_id(run_id: str) -> str:
    return b32encode(run_id.encode("ascii")).decode("ascii")


def decode_run_id(name: str) -> str | None:
    """The run id a file name encodes; None for a name that is no run (a stray file)."""
    try:
        return b32decode(name).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None


class _Local:
    """A local directory tree through ``os`` (the fast path)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def write(self, path: str, text: str, append: bool = False) -> None:
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(text)

    def read(self, path: str) -> str:
        """A regular file's text. The tracker dir is shared: a FIFO or a device there must
        not block a reader (O_NONBLOCK, then fstat), anything but a regular file is OSError."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            f = open(fd, encoding="utf-8")
        except BaseException:
            os.close(fd)
            raise
        with f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of each directory and regular file; none when ``path`` is
        no directory that can be read. Anything else (a FIFO, a socket, a dangling link or a
        link loop: ELOOP) is left out, as an entry being written is."""
        out = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    try:
                        mode = e.stat().st_mode  # follows a link, as the reads will
                    except OSError:
                        continue
                    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                        out.append((e.name, stat.S_ISDIR(mode)))
        except OSError:  # missing, no dir, a link loop, unreadable
            return []
        return out


class _Remote(_Local):
    """Any fsspec filesystem (``memory://``, ``s3://``, ...)."""

    def __init__(self, fs: Any, root: str) -> None:
        super().__init__(root)
        self.fs = fs

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def write(self, path: str, text: str, append: bool = False) -> None:
        with self.fs.open(path, "a" if append else "w") as f:
            f.write(text)

    def read(self, path: str) -> str:
        with self.fs.open(path, "r") as f:
            return str(f.read())

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def listdir(self, path: str) -> list[tuple[str, bool]]:
        if not self.fs.exists(path):
            return []
        return [
            (posixpath.basename(e["name"].rstrip("/")), e["type"] == "directory")
            for e in self.fs.listdir(path)
            if e.get("type") in ("directory", "file")
        ]


def _time_order(name: str) -> tuple[int, str]:
    """An entry's place: its time (``<time_ns>``, TorchX's, or ``<time_ns>-<writer>``), then
    its name (one order for every reader when two writers share a time); other names first."""
    ns = name.partition("-")[0]
    return (int(ns), name) if ns.isdigit() else (-1, name)


class FsspecTracker(TrackerBase):
    """Runs stored as files under ``root`` (see the module's docstring for the layout)."""

    def __init__(self, fs: _Local | Any, root_dir: str | None = None) -> None:
        """TorchX's ``FsspecTracker(fs, root_dir)``: an fsspec filesystem and the root on it
        (a local one takes the fast ``os`` path); or xrun's own ``FsspecTracker(store)``."""
        if root_dir is not None:
            fs = _store_on(fs, root_dir)
        elif not isinstance(fs, _Local):
            raise TypeError("FsspecTracker(fs, root_dir): give the root dir on the filesystem")
        self._store: _Local = fs
        self._made: set[str] = set()  # dirs this process created (one mkdir per category)
        self._last_ns = 0

    @property
    def root(self) -> str:
        return self._store.root

    def __repr__(self) -> str:
        return f"<FsspecTracker: root_path={self.root}>"

    def _run_dir(self, run_id: str, *parts: str) -> str:
        return posixpath.join(self.root, encode_run_id(run_id), *parts)

    def _unique_name(self) -> str:
        # The time orders entries (two of one writer never share one); the pid and random part
        # keep two writers that read the same time_ns from writing one file.
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return f"{self._last_ns}-{os.getpid()}-{os.urandom(4).hex()}"

    def _persist(self, run_id: str, category: str, content: Mapping[str, object]) -> None:
        folder = self._run_dir(run_id, category)
        if folder not in self._made:
            self._store.makedirs(folder)
            self._made.add(folder)
        self._store.write(posixpath.join(folder, self._unique_name()), json.dumps(content))

    def _load(self, run_id: str, category: str) -> list[dict[str, Any]]:
        folder = self._run_dir(run_id, category)
        out = []
        for name, _ in sorted(self._store.listdir(folder), key=lambda e: _time_order(e[0])):
            try:
                entry = json.loads(self._store.read(posixpath.join(folder, name)))
            except (OSError, ValueError):  # being written right now, or not ours
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._persist(run_id, "metadata", {"metadata": kwargs})

    def metadata(self, run_id: str) -> dict[str, object]:
        merged: dict[str, object] = {}
        for entry in self._load(run_id, "metadata"):
            if isinstance(entry.get("metadata"), dict):
                merged.update(entry["metadata"])
        return merged

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        entry = {"name": name, "path": path, "metadata": dict(metadata) if metadata else metadata}
        self._persist(run_id, "artifacts", entry)

    def artifacts(self, run_id: str) -> dict[str, TrackerArtifact]:
        out = {}
        for e in self._load(run_id, "artifacts"):
            if "name" in e and "path" in e:
                out[str(e["name"])] = TrackerArtifact(
                    str(e["name"]), str(e["path"]), e.get("metadata")
                )
        return out

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        folder = self._run_dir(run_id, "sources")
        self._store.makedirs(folder)
        line = f"{artifact_name or ''}\n"
        self._store.write(posixpath.join(folder, encode_run_id(source_id)), line)
        # As TorchX: the parent learns of its child only when its descendants dir exists.
        descendants = self._run_dir(source_id, "descendants")
        if self._store.exists(descendants):
            self._store.write(posixpath.join(descendants, encode_run_id(run_id)), line, True)

    def sources(self, run_id: str, artifact_name: str | None = None) -> list[TrackerSource]:
        folder = self._run_dir(run_id, "sources")
        out = []
        for name, _ in sorted(self._store.listdir(folder)):
            source = decode_run_id(name)
            if source is None:
                continue
            try:
                text = self._store.read(posixpath.join(folder, name))
            except (OSError, ValueError):  # being written right now, or not ours
                continue
            if not text.endswith("\n"):
                # Every writer (this one, TorchX's) ends the relation with a newline: a file
                # without it is being written (created empty, then filled): read now, "" would
                # say "no artifact" and "data" a wrong one for the "dataset" being written.
                continue
            kinds = [k.strip() for k in text.splitlines()]
            kinds = [k for k in kinds if k]
            if not kinds and not artifact_name:
                out.append(TrackerSource(source, None))
            out += [
                TrackerSource(source, k) for k in kinds if not artifact_name or k == artifact_name
            ]
        return out

    def has_run(self, run_id: str) -> bool:
        """Whether the root holds a run of that id (xrun's addition, for ``tracker list``)."""
        return run_id.isascii() and self._store.exists(self._run_dir(run_id))

    def run_ids(self, **kwargs: str) -> list[str]:
        """Every run under the root; ``parent_run_id=ID``: only the runs with that source."""
        parent = kwargs.get("parent_run_id")
        out = []
        for name, is_dir in sorted(self._store.listdir(self.root)):
            run_id = decode_run_id(name) if is_dir else None
            if run_id is None:
                continue
            if parent and not self._store.exists(
                posixpath.join(self.root, name, "sources", encode_run_id(parent))
            ):
                continue
            out.append(run_id)
        return out

    def lineage(self, run_id: str) -> Lineage:
        raise NotImplementedError("lineage: not implemented by TorchX 0.7.0's backends either")


# --------------------------------------------------------------------------- building one
def _read_torchx_config(path: str) -> dict[str, Any]:
    """TorchX's config file: ``key=value`` lines (``#`` comments); ``a.b=v`` nests."""
    data: dict[str, Any] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not (key.strip() and sep and value.strip()):
                continue
            *outer, last = key.strip().split(".")
            node = data
            for part in outer:
                node = node.setdefault(part, {})
            node[last] = value.strip()
    return data


def store_for(config: str) -> _Local:
    """The store a tracker config names: a TorchX config file (``protocol`` and
    ``root_path``, the rest fsspec's options), a local dir, ``file://DIR``, or any fsspec URL.
    A local root is created if missing (TorchX requires it to exist)."""
    if os.path.isfile(config):
        opts = _read_torchx_config(config)
        if "protocol" not in opts or "root_path" not in opts:
            raise UsageError(
                f"tracker config file {config}: give 'protocol' and 'root_path' "
                "(e.g. protocol=file and root_path=/shared/tracker)"
            )
        protocol, root = str(opts.pop("protocol")), str(opts.pop("root_path"))
        if protocol in ("file", "local") and not opts:
            return _local(root)
        # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
        import fsspec

        return _Remote(fsspec.filesystem(protocol, **opts), root)
    if config.startswith("file://"):
        return _local(config[len("file://") :])
    if "://" not in config:
        return _local(config)
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(config)
    # No makedirs here: building the backend in a job touches no network (the first write
    # creates the dirs it needs, within the deadline of xrun.tracker.guard).
    return _Remote(fs, root)


def _store_on(fs: Any, root: str) -> _Local:
    """The store for TorchX's ``FsspecTracker(fs, root_dir)`` constructor."""
    protocol = getattr(fs, "protocol", None)
    names = (protocol,) if isinstance(protocol, str) else tuple(protocol or ())
    if "file" in names or "local" in names:
        return _local(root)
    return _Remote(fs, root)


def _local(root: str) -> _Local:
    root = os.path.abspath(os.path.expanduser(root))
    os.makedirs(root, exist_ok=True)
    return _Local(root)


def default_root() -> str:
    """The embedded default's root: ``$XDG_STATE_HOME/xrun/tracker``."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.xdg import state_dir

    return state_dir("tracker")


def read_only_default() -> FsspecTracker:
    """The embedded default for reading: its root is not created (no run: none listed)."""
    return FsspecTracker(_Local(default_root()))


def create(config_file: str | None) -> FsspecTracker:
    """The factory (TorchX's ``torchx.tracker.backend.fsspec:create``): ``config_file`` as
    in :func:`store_for` (TorchX's config file, or a dir or URL); None: the embedded default
    under xrun's state dir."""
    return FsspecTracker(store_for(config_file or default_root()))
