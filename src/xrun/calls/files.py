"""The call folder both sides share, and its size-bounded pickle files.

A call's folder (``<folder>/<call id>/``) holds:

- ``call.pkl``             the caller's call (``fn``, ``args``, ``kwargs`` and options),
                           pickled by cloudpickle; a checkpoint (worker.py) replaces it
- ``<I>/args.pkl``         ``map_array``: call I's ``(args, kwargs)``; ``call.pkl`` holds
                           the function once; call I's outcomes go to ``<I>/``
- ``job.json``             what ``Job.attach(folder)`` needs to find the job again
- ``place.<RANK>``         ``REPLICA LOCAL_RANK`` of rank RANK's worker: whose log has its lines
- ``outcome.<RANK>.pkl``   what rank RANK's call gave: ``("ok", value)`` or
                           ``("error", exception, traceback text, rank)``; written to a
                           temporary name and renamed, so a reader never sees half a file

Only files go between the caller and the job (never a shell's arguments or environment), and
every file is bounded: a writer stops at the limit (the disk never fills with a runaway result)
and a reader refuses a file over it before loading anything.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, BinaryIO

CALL_FILE = "call.pkl"
JOB_FILE = "job.json"  # the caller's Job (handle, role, ...): Job.attach(folder) reads it
# job.json is a few hundred bytes; a larger one is no job's.
JOB_FILE_MAX = 64 * 1024
ARGS_FILE = "args.pkl"  # a map_array call's own (args, kwargs), in its folder <I>/
OUTCOME_PREFIX = "outcome."
OUTCOME_SUFFIX = ".pkl"

# The default bound on a call's pickled arguments and on each rank's pickled result. A result
# this big is a dataset, which belongs in a file whose path the function returns.
DEFAULT_MAX_BYTES = 1 << 30

OK = "ok"
ERROR = "error"


class TooLargeError(ValueError):
    """A pickle over the call's byte limit (``max_result_bytes``)."""


def outcome_file(folder: Path, rank: int) -> Path:
    return folder / f"{OUTCOME_PREFIX}{rank}{OUTCOME_SUFFIX}"


def place_file(folder: Path, rank: int) -> Path:
    return folder / f"place.{rank}"


def place(folder: Path, rank: int, nproc_per_node: int) -> tuple[int, int]:
    """(replica, local rank) of ``rank``'s worker, as it wrote it; before it did, the usual
    order (replica ``rank // nproc_per_node``)."""
    try:
        replica, local = place_file(folder, rank).read_text().split()
        return int(replica), int(local)
    except (OSError, ValueError):
        return divmod(rank, nproc_per_node)


def outcome_ranks(folder: Path) -> list[int]:
    """The ranks that wrote an outcome, in order."""
    ranks = []
    for name in os.listdir(folder):
        if name.startswith(OUTCOME_PREFIX) and name.endswith(OUTCOME_SUFFIX):
            middle = name[len(OUTCOME_PREFIX) : -len(OUTCOME_SUFFIX)]
            if middle.isdigit():
                ranks.append(int(middle))
    return sorted(ranks)


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


class _Bounded(io.RawIOBase):
    """A write-only file that raises TooLargeError instead of growing past ``limit``."""

    def __init__(self, f: BinaryIO, limit: int, what: str) -> None:
        self._f, self._limit, self._what, self._n = f, limit, what, 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = len(memoryview(b).cast("B"))
        if self._n + n > self._limit:
            raise TooLargeError(
                f"{self._what} is over the limit of {human_bytes(self._limit)} when pickled "
                "(max_result_bytes): write big data to a file and return its path"
            )
        self._n += n
        return self._f.write(b)


def dump(obj: object, path: Path, limit: int, what: str) -> None:
    """Pickle ``obj`` (cloudpickle: functions and classes by value where needed) into
    ``path`` atomically, at most ``limit`` bytes: TooLargeError, and no file, over it."""
    import cloudpickle

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as raw:
            cloudpickle.dump(obj, _Bounded(raw, limit, what), protocol=5)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path, limit: int, what: str) -> Any:
    """Unpickle ``path``; TooLargeError before reading a file over ``limit`` bytes."""
    import pickle

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise TooLargeError(
                f"{what} ({path}) is {human_bytes(size)}, over the limit of "
                f"{human_bytes(limit)} (max_result_bytes)"
            )
        return pickle.load(f)


def read_small(path: Path) -> str:
    """A small text file (``job.json``); ValueError when it is larger than any of ours."""
    with open(path, "rb") as f:
        data = f.read(JOB_FILE_MAX + 1)
    if len(data) > JOB_FILE_MAX:
        raise ValueError(f"over {JOB_FILE_MAX} bytes")
    return data.decode("utf-8")
