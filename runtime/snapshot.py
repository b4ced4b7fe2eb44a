"""Training state kept in the node's shared memory: commit it every step, restore it on restart.

A worker-side helper (the agent never imports it; torch is imported inside the functions only)::

    from xrun.runtime.snapshot import Snapshotter

    snap = Snapshotter(every=1)                  # where: see below; off when no restart can follow
    restored = snap.restore(model, opt, fallback=load_disk_checkpoint)   # every rank calls it
    start = restored.step if isinstance(restored, Restored) else ...     # else: fallback()'s value
    for step in range(start, total):
        train_one_step(step)
        snap.commit(step + 1, model=model, optimizer=opt, extra={"sampler_pos": ...})

``commit(step, ...)`` writes the model's and the optimizer's ``state_dict()``, the RNG states
(python, numpy if imported, torch CPU, CUDA if initialised) and ``extra`` into a memory-mapped
file on ``/dev/shm``: each tensor's raw bytes are copied into a preallocated region (one
``copy_``, no pickling of tensor data, no syscall), the small rest (names, shapes, optimizer
hyper-parameters, RNG tuples) is pickled. The state therefore survives the worker's death (it is
in the node's memory, not the process's) but not the node's. ``benchmarks/snapshot.py`` measures
the cost; docs/recovery.md has the figures and the recipe.

**Never a half-written snapshot.** Two slots per rank, written in turn. A commit first
invalidates the slot it is about to overwrite, copies the data, writes the pickled rest, and
writes the slot's header last; the header carries the step, a generation, the lineage (below)
and a CRC32 of itself and of the pickled rest. A slot whose header is missing, torn or whose
CRC does not match is never loaded, and the other slot still holds the previous step. So the
header *is* the "current" pointer: restore takes the newest valid slot. The tensor bytes are not
checksummed (a CRC32 of 100 MB costs ~0.1 s, more than the copy): the write order above is what
guarantees they are complete, because a process killed mid-commit never wrote the header.

**Ranks agree.** After a kill the ranks' newest snapshots can differ by one step (the dead rank
died mid-commit, its peers finished). ``restore`` gathers every rank's valid steps (one
``all_gather_object``, when ``torch.distributed`` is initialised) and loads the newest step that
*every* rank holds; two slots make sure one exists. When none does (a rank moved to another
node, the world size changed, first start), every rank returns ``fallback``'s value instead.
Snapshots carry a *lineage*: a token drawn when training starts from something other than a
snapshot (a disk checkpoint, scratch); restoring keeps it. Only the newest lineage found in any
rank's directory on any node is restorable, so an old but self-consistent set of snapshots left
by ranks that have since moved elsewhere is never mistaken for the latest state. With
``replicated=True`` a lost node's ranks (nothing in their node's memory) get the newest step
the others hold from them instead: ``snapshot_peers.py``.

**Where, and cleanup.** ``$XRUN_SNAPSHOT_DIR/rank-<RANK>`` when that is set (the agent will set
it per job and remove it when the job ends); else ``/dev/shm/xrun-snapshots-<uid>/<run id>@
<node id>/rank-<RANK>``, the run id being ``XRUN_RUN_ID`` or ``TORCHELASTIC_RUN_ID``, the node
id ``XRUN_NODE_ID`` (when set). With neither run id (a plain
``python train.py``), or when ``TORCHELASTIC_MAX_RESTARTS`` says no restart can follow this
attempt, commits are no-ops: nothing could ever restore them. Files are removed: by
``close(remove=True)`` when training ends (the job's whole dir on the node); by the last allowed
attempt, right after its ``restore`` (each rank its own; it commits nothing); at a job's first start (restart count 0 in
round ``XRUN_ROUND`` 0: whatever is there is stale; a world re-formed without a failure keeps
it); and, for the default root, any job directory that no live process holds (a shared
``flock``) and that no attempt entered for ``GC_IDLE_S`` is deleted when a Snapshotter starts.
Memory: two slots per rank, each the size of the state (``posix_fallocate``d up front, so a full
``/dev/shm`` turns snapshots off with one warning instead of a SIGBUS mid-step).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import shutil
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xrun.contract import RDZV_ROUND_ENV

from . import snapshot_peers as peers
from .snapshot_keep import DEFAULT_ROOT, DIR_ENV, RUN_ID_ENVS, default_job_dir
from .snapshot_tree import _flatten, _numel, _rng_state, _set_rng_state, _unflatten

GC_IDLE_S = 600.0  # an unlocked job dir untouched this long belongs to a job that is gone
# How often a committing rank marks its job dir as in use (the lock's mtime): a job that runs
# for hours after its last start is still between holders for a moment at every failure (the
# ranks killed, their replacements not yet in), and another job's collector must not take its
# snapshots then. One utime a minute at most: nothing on a step's path.
TOUCH_EVERY_S = GC_IDLE_S / 10

MAGIC = b"XRSNAP01"
_BODY = struct.Struct("<QqII16sqQQQI")  # gen, step, world, rank, lineage, birth, data, meta...
_HEAD = struct.Struct("<8sI")  # magic, crc32(body)
HEADER_BYTES = 4096  # the header has a page of its own; data starts on the next page
ALIGN = 64  # every tensor starts on a cache line (and on any dtype's element size)
SLOTS = ("slot-0", "slot-1")


@dataclass(frozen=True)
class Restored:
    """What ``restore`` loaded from shared memory: the step committed, and ``extra``."""

    step: int
    extra: Any
    generation: int


@dataclass(frozen=True)
class _Header:
    generation: int
    step: int
    world: int
    rank: int
    lineage: bytes
    birth: int
    data_len: int
    meta_off: int
    meta_len: int
    meta_crc: int


def read_header(path: str | os.PathLike[str]) -> _Header | None:
    """The slot's header when the slot is complete: None when it is absent, was never
    completed, or its header or pickled part fails its CRC."""
    try:
        with open(path, "rb") as f:
            h = _parse_header(f.read(_HEAD.size + _BODY.size))
            if h is None or zlib.crc32(os.pread(f.fileno(), h.meta_len, h.meta_off)) != h.meta_crc:
                return None
    except OSError:
        return None
    return h


def _parse_header(raw: bytes) -> _Header | None:
    if len(raw) < _HEAD.size + _BODY.size:
        return None
    magic, crc = _HEAD.unpack_from(raw)
    body = raw[_HEAD.size : _HEAD.size + _BODY.size]
    if magic != MAGIC or zlib.crc32(body) != crc:
        return None
    return _Header(*_BODY.unpack(body))


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Snapshotter:
    """Commits a training loop's state to shared memory; restores the newest complete one.

    ``every``: commit every N-th step (``commit`` returns False for the others); 0 turns it off.
    ``dir``: the job's snapshot directory (default: from the environment, see the module doc).
    ``enabled``: force on or off (default: on when a restart can follow and a directory is known).
    ``replicated``: the model's and optimizer's state is the same on every rank (DDP): a rank
    that lost its node gets it from a peer, and its own RNG/``extra`` from its buddy's copy
    (``snapshot_peers.py``; each commit then also sends this rank's small part to its buddy).
    """

    def __init__(
        self,
        every: int = 1,
        *,
        dir: str | os.PathLike[str] | None = None,  # noqa: A002 - the natural name
        enabled: bool | None = None,
        replicated: bool = False,
    ) -> None:
        if every < 0:
            raise ValueError(f"every={every} is invalid: expected an integer >= 0")
        self.every = every
        self.rank = _env_int("RANK", 0)
        self.world = _env_int("WORLD_SIZE", 1)
        self.restart = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
        self.local = _env_int("LOCAL_WORLD_SIZE", self.world)
        self.replicated = replicated
        # The job's first start (no failure restart, the first world): what is here is stale.
        self.first = self.restart == 0 and _env_int(RDZV_ROUND_ENV, 0) == 0
        self.last_attempt = self.restart >= _env_int("TORCHELASTIC_MAX_RESTARTS", 1 << 30)
        # DEFAULT_ROOT read here, at each use: the tests point this module's at a tmp dir
        self.job_dir = Path(dir) if dir is not None else default_job_dir(root=DEFAULT_ROOT)
        on = self.job_dir is not None and every > 0 and not self.last_attempt
        self.enabled = on if enabled is None else (enabled and self.job_dir is not None)
        self._broken = ""  # why commits stopped (e.g. /dev/shm full)
        self._maps: list[tuple[int, mmap.mmap, Any] | None] = [None, None]  # (size, mm, u8)
        self._newest = -1  # the slot holding the newest commit (-1: none yet)
        self._generation = 0
        self._turn = 0  # the ward file the next buddy copy goes to
        self._lineage: tuple[bytes, int] | None = None  # set by restore
        self._lock_fd = -1
        self._touched = time.monotonic()  # the lock's mtime was set on entry (_enter)
        self._default_dir = dir is None and not os.environ.get(DIR_ENV)
        if self.job_dir is not None:
            self._enter()

    # ------------------------------------------------------------------ layout on disk
    @property
    def rank_dir(self) -> Path:
        assert self.job_dir is not None
        return self.job_dir / f"rank-{self.rank}"

    def _enter(self) -> None:
        """Create the dirs (private to this user), hold the job's lock, collect abandoned jobs."""
        assert self.job_dir is not None
        self.job_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.job_dir.mkdir(mode=0o700, exist_ok=True)
        if self.job_dir.stat().st_uid != os.getuid():
            raise PermissionError(f"{self.job_dir} belongs to another user: not using it")
        lock = self.job_dir / "lock"
        self._lock_fd = _hold(self.job_dir, lock)
        os.utime(lock)  # "an attempt entered now": keeps the dir from the collector below
        if self._default_dir:
            _collect_abandoned(self.job_dir.parent, keep=self.job_dir)
        if self.first:
            # A job's first start: a snapshot here is another job's that reused the run id.
            shutil.rmtree(self.rank_dir, ignore_errors=True)
        self.rank_dir.mkdir(mode=0o700, exist_ok=True)

    def _slot(self, i: int, size: int) -> tuple[mmap.mmap, Any]:
        """Slot i mapped with at least ``size`` bytes, allocated up front (ENOSPC, not SIGBUS)."""
        import torch

        cur = self._maps[i]
        if cur is not None and cur[0] >= size:
            return cur[1], cur[2]
        self._unmap(i)
        size = max(size + size // 8, 1 << 20)  # some slack: state dicts grow a little (Adam)
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.open(self.rank_dir / SLOTS[i], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, b"\0" * len(MAGIC), 0)  # invalid until a commit completes
            os.posix_fallocate(fd, 0, size)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # fault pages in now
            mm = mmap.mmap(fd, size, flags=flags)
        finally:
            os.close(fd)
        u8 = torch.frombuffer(mm, dtype=torch.uint8)
        self._maps[i] = (size, mm, u8)
        return mm, u8

    def _unmap(self, i: int) -> None:
        cur, self._maps[i] = self._maps[i], None
        if cur is not None:
            mm = cur[1]
            del cur  # the tensor over the map first: a map with an exported buffer cannot close
            mm.close()

    # ------------------------------------------------------------------ commit
    def commit(
        self, step: int, *, model: Any = None, optimizer: Any = None, extra: Any = None
    ) -> bool:
        """Save the state after ``step`` steps; True when written (False: not an N-th step, or
        off). Call ``restore`` first: it is where the ranks agree on the lineage."""
        if not self.enabled or step % self.every:
            return False
        if self._lineage is None:
            raise RuntimeError("Snapshotter.commit before restore(): call restore() once first")
        tree = {
            "model": model.state_dict() if model is not None else None,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "extra": extra,
            "rng": _rng_state(),
        }
        written = not self._broken and self._write(step, tree)
        now = time.monotonic()
        if written and now - self._touched >= TOUCH_EVERY_S and self.job_dir is not None:
            self._touched = now
            with contextlib.suppress(OSError):  # the dir gone: the next entry remakes it
                os.utime(self.job_dir / "lock")
        if self._peers():  # every rank, written or not: its buddy waits for the message
            part = peers.exchange(
                pickle.dumps({"rng": tree["rng"], "extra": extra}, protocol=5),
                self.rank, self.world, self.local,
            )  # fmt: skip
            ward = peers.ward_of(self.rank, self.world, self.local)
            lineage, birth = self._lineage
            try:
                peers.write_ward(
                    self.rank_dir, self._turn, ward, lineage, birth, step, self.world, part
                )
                self._turn ^= 1
            except OSError:
                pass  # /dev/shm full or the dir gone (snapshots off): only the copy is lost
        return written

    def _peers(self) -> bool:
        """Buddy copies are made: a replicated state, in a group of more than one node."""
        return self.replicated and self.world > self.local and peers.group() is not None

    def _write(self, step: int, tree: dict[str, Any]) -> bool:
        tensors: list[Any] = []
        skeleton = _flatten(tree, tensors)
        table, off = [], HEADER_BYTES
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            table.append((str(t.dtype).removeprefix("torch."), tuple(t.shape), off, str(t.device)))
            off = -(-(off + nbytes) // ALIGN) * ALIGN
        meta = pickle.dumps((skeleton, table), protocol=pickle.HIGHEST_PROTOCOL)
        slot = 1 - self._newest if self._newest >= 0 else 0
        try:
            mm, u8 = self._slot(slot, off + len(meta))
        except OSError as e:
            self._broken = f"{self.rank_dir}: {e}"
            print(f"xrun.snapshot: rank {self.rank}: snapshots off: {e}", file=sys.stderr)
            shutil.rmtree(self.rank_dir, ignore_errors=True)
            return False
        mm[: len(MAGIC)] = b"\0" * len(MAGIC)  # 1. invalidate: a kill from here on leaves no
        for t, (_, shape, at, _) in zip(tensors, table, strict=True):  # 2. the bytes
            n = t.numel() * t.element_size()
            u8[at : at + n].view(t.dtype).view(shape).copy_(t)
        mm[off : off + len(meta)] = meta  # 3. the rest
        self._generation += 1
        assert self._lineage is not None  # commit checked it
        lineage, birth = self._lineage
        body = _BODY.pack(
            self._generation, step, self.world, self.rank, lineage, birth, off - HEADER_BYTES,
            off, len(meta), zlib.crc32(meta),
        )  # fmt: skip
        mm[: _HEAD.size + _BODY.size] = _HEAD.pack(MAGIC, zlib.crc32(body)) + body  # 4. last
        self._newest = slot
        return True

    # ------------------------------------------------------------------ restore
    def restore(self, model: Any = None, optimizer: Any = None, *, fallback: Any = None) -> Any:
        """Load the newest snapshot every rank holds into ``model``/``optimizer`` and the RNGs;
        return a ``Restored``. Without one, return ``fallback()`` (a callable), the
        ``torch.load`` of ``fallback`` (a path that exists) or None. Every rank must call it
        (a collective when torch.distributed is initialised)."""
        mine = self._candidates() if self.enabled or self.last_attempt else {}
        newest = self._newest_lineage()
        proposal = (os.urandom(16), time.time_ns())
        on = self._peers() and (self.enabled or self.last_attempt) and not self.first
        wards = peers.read_wards(self.rank_dir, self.world) if on else {}
        self._turn = peers.next_turn(wards.get(peers.ward_of(self.rank, self.world, self.local)))
        reports = _gather((mine, newest, proposal, peers.report(wards)))
        lineage = max(r[1] for r in reports)[1]  # the newest lineage seen anywhere
        common = set.intersection(*({k for k in r[0] if k[0] == lineage} for r in reports))
        chosen = max(common, key=lambda k: k[1]) if common else None
        handed: tuple[Any, bytes, _Header] | None = None
        if chosen is None and self._peers():  # a node was lost: its peers hand its state over
            holds = [set(r[0]) for r in reports]
            p = peers.plan(holds, [r[3] for r in reports], lineage)
            if p is not None:
                chosen = (lineage, p.step)
                sizes = {
                    r: (_end(reports[src][0][chosen][1]), reports[p.part_from[r]][3][r][chosen])
                    for r, src in p.state_from.items()
                }
                got = peers.hand_over(
                    p, self.rank, lineage, lambda: self._slot_bytes(*mine[chosen]), wards, sizes
                )
                if got is not None:  # this rank lacked the step: whose bytes it got
                    handed = (*got, reports[p.state_from[self.rank]][0][chosen][1])
        if chosen is None:
            self._lineage = reports[0][2]  # rank 0's fresh token: a new lineage, shared by all
            self._after_restore()
            return _call_fallback(fallback)
        if handed is not None:  # a lacking rank: the peer's state, its own RNG and extra
            header, slot = handed[2], -1
            tree = {**_decode(handed[0], header), **pickle.loads(handed[1])}
        else:
            slot, header = mine[chosen]
            tree = self._load(slot, header)
        if model is not None:
            model.load_state_dict(tree["model"])
        if optimizer is not None:
            optimizer.load_state_dict(tree["optimizer"])
        _set_rng_state(tree["rng"])
        self._lineage = (header.lineage, header.birth)
        self._generation = header.generation
        self._newest = slot  # the next commit overwrites the other slot, never this one (-1:
        # handed over, nothing of this step is here: the next commit writes slot 0)
        self._after_restore()
        return Restored(step=header.step, extra=tree["extra"], generation=header.generation)

    def _after_restore(self) -> None:
        if self.last_attempt and self.job_dir is not None:
            # No restart can follow: nothing will read a snapshot again.
            self._remove_mine()

    def _candidates(self) -> dict[tuple[bytes, int], tuple[int, _Header]]:
        """(lineage, step) -> (slot, header) of this rank's valid slots for this world."""
        out: dict[tuple[bytes, int], tuple[int, _Header]] = {}
        if self.job_dir is None or self.first:
            return out
        for i, name in enumerate(SLOTS):
            h = read_header(self.rank_dir / name)
            if h is not None and (h.world, h.rank) == (self.world, self.rank):
                key = (h.lineage, h.step)
                if key not in out or out[key][1].generation < h.generation:
                    out[key] = (i, h)
        return out

    def _newest_lineage(self) -> tuple[int, bytes]:
        """(birth, token) of the newest lineage in any rank's slots on this node."""
        best = (-1, b"")
        if self.job_dir is None or self.first:
            return best
        try:
            with os.scandir(self.job_dir) as it:
                ranks = [e.name for e in it if e.name.startswith("rank-")]
        except FileNotFoundError:
            return best
        # Not Path.glob("rank-*/slot-*"): a peer on its last attempt may remove its rank dir
        # between the listing and glob's scandir of it (FileNotFoundError); a missing slot
        # only reads as no header.
        for path in (self.job_dir / r / name for r in ranks for name in SLOTS):
            h = read_header(path)
            if h is not None and h.world == self.world:
                best = max(best, (h.birth, h.lineage))
        return best

    def _load(self, slot: int, h: _Header) -> Any:
        import torch

        with open(self.rank_dir / SLOTS[slot], "rb") as f:
            # Copy-on-write: writable for torch.frombuffer, and never written back.
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            u8 = torch.frombuffer(mm, dtype=torch.uint8)
            tree = _decode(u8, h)
            del u8  # the export must go before the map can close
        finally:
            mm.close()
        return tree

    def _slot_bytes(self, slot: int, h: _Header) -> bytes:
        """The slot's header, tensor bytes and pickled rest, as a peer's ``_decode`` reads them."""
        with open(self.rank_dir / SLOTS[slot], "rb") as f:
            data = os.pread(f.fileno(), _end(h), 0)
        if zlib.crc32(data[h.meta_off :]) != h.meta_crc:
            raise RuntimeError(f"{self.rank_dir / SLOTS[slot]} changed while restoring")
        return data

    # ------------------------------------------------------------------ cleanup
    def close(self, remove: bool = False) -> None:
        """Unmap the slots. ``remove=True`` once training is over (after the last collective,
        every rank done): delete the job's snapshots on this node, every rank's, including
        those of ranks an elastic shrink took away."""
        for i in range(len(self._maps)):
            self._unmap(i)
        self._newest = -1
        if remove and self.job_dir is not None:
            shutil.rmtree(self.job_dir, ignore_errors=True)
            self._release()

    def _remove_mine(self) -> None:
        """This rank's snapshots only (its peers may still be loading theirs)."""
        self.close()
        if self.job_dir is not None:
            shutil.rmtree(self.rank_dir, ignore_errors=True)
            self._release()
            try:
                left = any(self.job_dir.glob("rank-*"))
            except FileNotFoundError:  # a peer on this node removed the job dir meanwhile
                return
            if not left:
                _remove_unheld(self.job_dir)

    def _release(self) -> None:
        self.enabled = False
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


# ---------------------------------------------------------------------- helpers
def _hold(job_dir: Path, lock: Path) -> int:
    """A shared flock on ``lock`` in ``job_dir`` (made if missing), held while this process
    lives. A peer's last-attempt cleanup may delete the dir between our mkdir and our open, or
    unlink the lock between our open and our flock: look again until the lock we hold is the
    one at the path (a crash here, FileNotFoundError, was seen in the recovery drill)."""
    for _ in range(20):
        job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(f"{job_dir} kept vanishing while this rank entered it (20 tries)")


def _remove_unheld(job_dir: Path) -> None:
    """Delete ``job_dir`` unless a live process holds its lock (a peer using or entering it).
    The exclusive lock is kept through the delete: an entrant that opened the lock meanwhile
    blocks in its flock, then finds the inode gone and makes a new dir (``_hold``)."""
    try:
        fd = os.open(job_dir / "lock", os.O_RDWR)
    except OSError:
        return  # no lock: an entrant is between its mkdir and its open; it will use the dir
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        shutil.rmtree(job_dir, ignore_errors=True)
    finally:
        os.close(fd)


def _collect_abandoned(root: Path, keep: Path) -> None:
    """Delete job dirs no live process holds and no attempt entered for GC_IDLE_S."""
    for job in root.iterdir():
        if job == keep or not job.is_dir():
            continue
        try:
            if time.time() - (job / "lock").stat().st_mtime < GC_IDLE_S:
                continue
        except OSError:
            continue  # no lock: being made right now, or not a Snapshotter's dir
        _remove_unheld(job)


def _gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (rank order); just ``[obj]`` without an initialised group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [obj]
    if dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _end(h: _Header) -> int:
    return h.meta_off + h.meta_len


def _decode(u8: Any, h: _Header) -> Any:
    """The state tree in a slot's bytes (``u8``: a uint8 tensor over them), tensors copied out."""
    import torch

    meta = bytes(u8[h.meta_off : _end(h)].numpy())
    if zlib.crc32(meta) != h.meta_crc:  # nobody writes between gather and load
        raise RuntimeError("a snapshot changed while restoring")
    skeleton, table = pickle.loads(meta)
    tensors = []
    for dtype, shape, at, device in table:
        dt = getattr(torch, dtype)
        n = _numel(shape) * torch.empty(0, dtype=dt).element_size()
        t = u8[at : at + n].view(dt).view(shape).clone()  # owned: the buffer may go
        tensors.append(t if device == "cpu" else t.to(device))
    return _unflatten(skeleton, tensors)


def _call_fallback(fallback: Any) -> Any:
    if fallback is None:
        return None
    if callable(fallback):
        return fallback()
    if os.path.exists(fallback):
        import torch

        return torch.load(fallback, weights_only=True)
    return None


__all__ = ["DIR_ENV", "RUN_ID_ENVS", "Restored", "Snapshotter", "read_header"]
