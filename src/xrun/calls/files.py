"""The call folder both sides share, and its size-bounded pickle files.

A call's folder (``<folder>/<call id>/``) holds:

- ``call.pkl``             the caller's call (``fn``, ``args``, ``kwargs`` and options),
                           pickled by cloudpickle; a checkpoint (worker.py) replaces it
- ``<I>/args.pkl``         ``map_array``: call I's ``(args, kwargs)``; ``call.pkl`` holds
                           the function once; call I's places and attempts go to ``<I>/``
- ``job.json``             what ``Job.attach(folder)`` needs to find the job again
- ``place.<RANK>``         ``REPLICA LOCAL_RANK`` of rank RANK's worker: whose log has its lines
- ``attempt.<Q>.<S>.<W>/`` one start of the workers (:class:`Attempt`: Q Slurm requeues, S the
                           rendezvous round, W the world size), made by each worker as it starts
- ``attempt.../outcome.<RANK>.pkl``  what rank RANK's call gave in that attempt: ``("ok",
                           value)`` or ``("error", exception, traceback text, rank)``

Every file is written to a temporary name and renamed, so a reader never sees half of one.

Outcomes are kept per attempt because a restart does not rewrite every rank's: after an elastic
shrink (a node lost, the job re-formed smaller) ranks past the new world never run again, and a
straggler of an old attempt (a worker its agent has not stopped yet) may still write one. The
reader takes the latest attempt's outcomes only (:func:`latest_attempt`), so neither can pass
for the final attempt's; nothing is deleted for that, so no reader ever has a file pulled from
under it (an older attempt's folder stays: errors, or values written before a restart).
A folder with no attempt folder but outcomes of its own was written by an older xrun (a job dir
from before, a worker in an image with an older xrun): those are read as its one attempt
(:data:`FLAT`).

Only files go between the caller and the job (never a shell's arguments or environment), and
every file is bounded: a writer stops at the limit (the disk never fills with a runaway result)
and a reader refuses a file over it before loading anything.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from xrun.attempt_env import attempt_of_env, count

CALL_FILE = "call.pkl"
JOB_FILE = "job.json"  # the caller's Job (handle, role, ...): Job.attach(folder) reads it
# job.json is a few hundred bytes; a larger one is no job's.
JOB_FILE_MAX = 64 * 1024
ARGS_FILE = "args.pkl"  # a map_array call's own (args, kwargs), in its folder <I>/
OUTCOME_PREFIX = "outcome."
OUTCOME_SUFFIX = ".pkl"
ATTEMPT_PREFIX = "attempt."

# The default bound on a call's pickled arguments and on each rank's pickled result. A result
# this big is a dataset, which belongs in a file whose path the function returns.
DEFAULT_MAX_BYTES = 1 << 30

OK = "ok"
ERROR = "error"


class TooLargeError(ValueError):
    """A pickle over the call's byte limit (``max_result_bytes``)."""


@dataclass(frozen=True, order=True)
class Attempt:
    """One start of a call's workers, the same in each of its ranks; a later start compares
    greater: ``requeues`` (Slurm's SLURM_RESTART_COUNT), then ``round`` (the rendezvous round,
    XRUN_ROUND: failure and membership restarts both start a new one), and ``world``
    (WORLD_SIZE: how many ranks it has)."""

    requeues: int
    round: int
    world: int

    @classmethod
    def of_env(cls, env: Mapping[str, str]) -> Attempt:
        """This worker's attempt (see :func:`xrun.attempt_env.attempt_of_env`)."""
        requeues, start = attempt_of_env(env)
        return cls(requeues, start, count(env, "WORLD_SIZE") or 1)

    @property
    def name(self) -> str:
        return f"{ATTEMPT_PREFIX}{self.requeues}.{self.round}.{self.world}"


# The outcomes an older xrun wrote into the call's folder itself (no attempt folders yet): the
# one attempt there is, before any of this xrun's. Its world is not known (0: the ranks that
# wrote count, as that xrun read them).
FLAT = Attempt(-1, -1, 0)


def attempt_dir(folder: Path, attempt: Attempt) -> Path:
    return folder if attempt == FLAT else folder / attempt.name


def start_attempt(folder: Path, attempt: Attempt) -> Path:
    """The attempt's folder, made if this is its first worker."""
    path = attempt_dir(folder, attempt)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def latest_attempt(folder: Path) -> Attempt | None:
    """The latest attempt that started (None: no worker has yet); :data:`FLAT` for the
    outcomes of an older xrun's workers."""
    latest = None
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None
    for name in names:
        if not name.startswith(ATTEMPT_PREFIX):
            continue
        parts = name[len(ATTEMPT_PREFIX) :].split(".")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            attempt = Attempt(*(int(p) for p in parts))
            latest = attempt if latest is None else max(latest, attempt)
    if latest is None and any(_rank_of(name) is not None for name in names):
        return FLAT
    return latest


def outcome_file(folder: Path, rank: int) -> Path:
    """Rank ``rank``'s outcome in ``folder``: an attempt's folder (:func:`attempt_dir`)."""
    return folder / f"{OUTCOME_PREFIX}{rank}{OUTCOME_SUFFIX}"


def place_file(folder: Path, rank: int) -> Path:
    return folder / f"place.{rank}"


def write_place(folder: Path, rank: int, replica: str, local_rank: str) -> None:
    """Rank ``rank``'s place (see :func:`place`), written whole: a temporary file renamed over
    the last one, so a reader never sees a partly written one."""
    path = place_file(folder, rank)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(f"{replica} {local_rank}\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def place(folder: Path, rank: int, nproc_per_node: int) -> tuple[int, int]:
    """(replica, local rank) of ``rank``'s worker, as it wrote it; before it did, the usual
    order (replica ``rank // nproc_per_node``)."""
    try:
        replica, local = place_file(folder, rank).read_text().split()
        return int(replica), int(local)
    except (OSError, ValueError):
        return divmod(rank, nproc_per_node)


def outcome_ranks(folder: Path) -> list[int]:
    """The ranks that wrote an outcome into ``folder`` (an attempt's), in order."""
    ranks = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        rank = _rank_of(name)
        if rank is not None:
            ranks.append(rank)
    return sorted(ranks)


def _rank_of(name: str) -> int | None:
    """The rank whose outcome file is named ``name`` (None: no outcome file)."""
    if name.startswith(OUTCOME_PREFIX) and name.endswith(OUTCOME_SUFFIX):
        middle = name[len(OUTCOME_PREFIX) : -len(OUTCOME_SUFFIX)]
        if middle.isdigit():
            return int(middle)
    return None


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
