"""xrun.runtime.snapshot: training state in shared memory, restored bit for bit, never half.

Real torch models and optimizers, real files on a tmpfs (/dev/shm, or the test's own small
tmpfs for a full one), real processes SIGKILLed mid-commit. The multi-rank agreement and the
resume of a real job are in tests/e2e/test_snapshot_resume.py.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.box import tmpfs
from xrun.runtime import snapshot
from xrun.runtime.snapshot import Restored, Snapshotter, read_header


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job dir on /dev/shm (removed afterwards) and the env of a first start, rank 0 of 1."""
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_MAX_RESTARTS", "XRUN_RUN_ID", snapshot.DIR_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    d = Path("/dev/shm") / f"xrun-test-{os.getpid()}-{tmp_path.name}"
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def restart(monkeypatch: pytest.MonkeyPatch, n: int = 1) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(n))


def make(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return model, opt


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, 8)  # the global RNG: restored too, or the runs part ways
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def same(a: Any, b: Any) -> bool:
    """Equal trees, tensors compared bit for bit (dtype and shape included)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def draws() -> tuple[float, float]:
    return random.random(), float(np.random.rand())


def test_restore_is_bit_identical_and_training_goes_on_alike(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = make(0)
    snap = Snapshotter(dir=shm)
    assert snap.restore(model, opt) is None  # first start: nothing to restore
    train(model, opt, 3)
    extra = {"sampler_pos": 37, "odd": torch.arange(5, dtype=torch.int16)[::2]}  # not contiguous
    assert snap.commit(3, model=model, optimizer=opt, extra=extra)
    want_model, want_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    # What python's and numpy's RNGs give right after the commit (torch's is checked by
    # training on: each step draws its batch from it).
    want_draws = draws()
    train(model, opt, 4)  # then the undisturbed run goes on
    snap.close()

    restart(monkeypatch)
    model2, opt2 = make(1)  # other weights, empty optimizer state, other RNG states
    random.seed(5)
    np.random.seed(5)
    got = Snapshotter(dir=shm).restore(model2, opt2)
    assert isinstance(got, Restored) and got.step == 3
    assert got.extra["sampler_pos"] == 37 and torch.equal(got.extra["odd"], extra["odd"])
    assert same(model2.state_dict(), want_model)
    assert same(opt2.state_dict(), want_opt)
    assert draws() == want_draws
    train(model2, opt2, 4)
    assert same(model2.state_dict(), model.state_dict())
    assert same(opt2.state_dict(), opt.state_dict())


def test_every_nth_step_and_the_newest_of_two_slots(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = Snapshotter(every=2, dir=shm)
    snap.restore()
    assert [snap.commit(s, extra=s) for s in range(1, 8)] == [
        False, True, False, True, False, True, False,
    ]  # fmt: skip
    steps = sorted(h.step for p in (shm / "rank-0").glob("slot-*") if (h := read_header(p)))
    assert steps == [4, 6]
    restart(monkeypatch)
    got = Snapshotter(dir=shm).restore()
    assert isinstance(got, Restored) and (got.step, got.extra) == (6, 6)


def test_commit_needs_restore_first(shm: Path) -> None:
    with pytest.raises(RuntimeError, match="restore"):
        Snapshotter(dir=shm).commit(1, extra=1)


# A child that commits a 48 MiB state whose every byte depends on the step, forever; it prints
# each step once committed. With DIE_AT, it dies (os._exit) halfway through that step's commit.
CHILD = """\
import os, sys, torch
from xrun.runtime.snapshot import Snapshotter
snap = Snapshotter(dir=sys.argv[1])
snap.restore()
die_at = int(sys.argv[2])
state = {f"t{i}": torch.empty(3 * 2**20, dtype=torch.float32) for i in range(4)}
real_copy, n = torch.Tensor.copy_, [0]
def copy_(dst, src, *a, **k):
    n[0] += 1
    if step == die_at and n[0] == 2:  # the second tensor of the dying step, half written
        real_copy(dst[: dst.numel() // 2], src[: src.numel() // 2])
        os._exit(17)
    return real_copy(dst, src, *a, **k)
torch.Tensor.copy_ = copy_
step = 0
while True:
    step += 1
    for i, t in enumerate(state.values()):
        t.fill_(step * 10 + i)
    n[0] = 0
    snap.commit(step, extra=state)
    print(step, flush=True)
"""


def _child(shm: Path, die_at: int = 0) -> subprocess.Popen[str]:
    env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": "0"}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shm), str(die_at)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _check_restored(shm: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    restart(monkeypatch)
    got = Snapshotter(dir=shm).restore()
    assert isinstance(got, Restored)
    for i, t in enumerate(got.extra.values()):
        assert bool((t == got.step * 10 + i).all()), f"step {got.step}: tensor {i} is mixed"
    return got.step


def test_a_commit_cut_halfway_is_never_loaded(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child(shm, die_at=5)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 17 and out.split() == ["1", "2", "3", "4"], out
    # Step 5 went to the slot step 3 was in: that slot is invalid now, step 4 is intact.
    assert sorted(h.step for p in (shm / "rank-0").glob("slot-*") if (h := read_header(p))) == [4]
    assert _check_restored(shm, monkeypatch) == 4


@pytest.mark.timeout(240)
def test_sigkill_at_random_moments_never_leaves_a_mixed_snapshot(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(3)
    for _ in range(4):
        child = _child(shm)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"  # past start-up: commits are under way
        time.sleep(rng.uniform(0.0, 0.4))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=60)
        last = int(out.split()[-1]) if out.split() else 1
        step = _check_restored(shm, monkeypatch)
        assert step >= last  # every step the child reported committed is there
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")


@pytest.mark.parametrize("where", ["header", "pickled part"])
def test_a_corrupt_slot_is_skipped(shm: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    snap = Snapshotter(dir=shm)
    snap.restore()
    snap.commit(1, extra="one")
    snap.commit(2, extra="two")
    snap.close()
    path = next(p for p in (shm / "rank-0").glob("slot-*") if read_header(p).step == 2)  # type: ignore[union-attr]
    h = read_header(path)
    assert h is not None
    at = 20 if where == "header" else h.meta_off + h.meta_len // 2
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert read_header(path) is None
    restart(monkeypatch)
    got = Snapshotter(dir=shm).restore()
    assert isinstance(got, Restored) and (got.step, got.extra) == (1, "one")


def test_fallback_when_no_snapshot(shm: Path, tmp_path: Path) -> None:
    model, _ = make(0)
    snap = Snapshotter(dir=shm)
    assert snap.restore(fallback=lambda: "from disk") == "from disk"
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"step": 7}, ckpt)
    assert Snapshotter(dir=shm).restore(fallback=str(ckpt)) == {"step": 7}
    assert Snapshotter(dir=shm).restore(fallback=str(tmp_path / "none.pt")) is None


def test_a_first_start_ignores_and_wipes_what_a_reused_run_id_left(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = Snapshotter(dir=shm)
    snap.restore()
    snap.commit(1, extra="old job")
    snap.close()
    # A new job with the same dir starts (restart 0): the old job's state is not its own.
    assert Snapshotter(dir=shm).restore(fallback=lambda: "disk") == "disk"
    assert list((shm / "rank-0").iterdir()) == []


def test_only_the_newest_lineage_is_restored(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank dirs left by ranks that moved elsewhere hold an older, self-consistent state: it must
    lose to a newer lineage found in any rank dir of the node."""
    snap = Snapshotter(dir=shm)
    snap.restore()
    snap.commit(30, extra="old")
    snap.close()
    restart(monkeypatch)
    monkeypatch.setenv("RANK", "1")  # later: this node hosts rank 1, started from disk at 20
    other = Snapshotter(dir=shm)
    assert other.restore() is None  # rank 1 has nothing here: a new lineage
    other.commit(21, extra="new")
    other.close()
    restart(monkeypatch, 2)
    monkeypatch.setenv("RANK", "0")  # and rank 0 again: its step 30 is stale
    assert Snapshotter(dir=shm).restore(fallback=lambda: "disk") == "disk"


def test_cleanup(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")  # a rank an elastic shrink took away left its snapshots
    gone = Snapshotter(dir=shm)
    gone.restore()
    gone.commit(1, extra=1)
    monkeypatch.setenv("RANK", "0")
    snap = Snapshotter(dir=shm)
    snap.restore()
    snap.commit(1, extra=1)
    snap.close(remove=True)  # training over: the job's dir goes, every rank's snapshots
    assert not shm.exists()
    gone.close()
    # The last allowed attempt restores, then removes: no restart could read a snapshot again.
    snap = Snapshotter(dir=shm)
    snap.restore()
    snap.commit(1, extra=1)
    snap.close()
    os.close(snap._lock_fd)  # its process ends: the lock it held goes with it
    restart(monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    last = Snapshotter(dir=shm)
    got = last.restore()
    assert isinstance(got, Restored) and got.step == 1
    assert not last.commit(2, extra=2) and not shm.exists()


def test_off_without_a_place_or_a_restart_to_come(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in snapshot.RUN_ID_ENVS:
        monkeypatch.delenv(k, raising=False)
    plain = Snapshotter()  # plain `python train.py`: no run id
    assert not plain.enabled and plain.restore() is None and not plain.commit(1, extra=1)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert not Snapshotter(dir=shm).enabled  # --max-restarts 0: nothing could restore it


def test_abandoned_job_dirs_are_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shm: Path
) -> None:
    monkeypatch.setattr(snapshot, "DEFAULT_ROOT", str(tmp_path))
    root = tmp_path / f"xrun-snapshots-{os.getuid()}"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "live")
    live = Snapshotter()  # holds its job's lock
    assert live.job_dir == root / "live"
    old = time.time() - 2 * snapshot.GC_IDLE_S
    for name in ("gone", "recent"):
        (root / name / "rank-0").mkdir(parents=True)
        (root / name / "lock").touch()
    os.utime(root / "gone" / "lock", (old, old))
    os.utime(root / "live" / "lock", (old, old))  # idle, but a live process holds it
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "next")
    Snapshotter()
    assert sorted(p.name for p in root.iterdir()) == ["live", "next", "recent"]


def test_a_long_running_job_between_attempts_is_not_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shm: Path
) -> None:
    """A job that last (re)started more than GC_IDLE_S ago still commits; at a failure its
    ranks die and, until the replacements enter, nobody holds its lock. Another job starting on
    the node then must not collect its snapshots: commits keep the lock's mtime fresh."""
    monkeypatch.setattr(snapshot, "DEFAULT_ROOT", str(tmp_path))
    monkeypatch.setattr(snapshot, "TOUCH_EVERY_S", 0.0, raising=False)  # a minute, at once
    root = tmp_path / f"xrun-snapshots-{os.getuid()}"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "long")
    job = Snapshotter()
    job.restore()
    old = time.time() - 2 * snapshot.GC_IDLE_S
    os.utime(root / "long" / "lock", (old, old))  # entered long ago
    assert job.commit(1, extra=torch.arange(4))  # ... and still training
    os.close(job._lock_fd)  # its ranks killed: nobody holds the lock now
    job._lock_fd = -1
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another")
    Snapshotter()
    assert (root / "long" / "rank-0").is_dir(), "a live job's snapshots were collected"


def test_a_full_shm_turns_snapshots_off_not_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shm: Path
) -> None:
    with tmpfs(tmp_path / "box", size="4m") as box:
        snap = Snapshotter(dir=box / "job")
        snap.restore()
        big = torch.zeros(2 * 2**20)  # 8 MiB: cannot fit
        assert not snap.commit(1, extra=big)
        assert not snap.commit(2, extra=big)  # off for good, quietly
        assert not (box / "job" / "rank-0").exists()


def test_importing_it_does_not_import_torch() -> None:
    code = "import sys, xrun.runtime.snapshot; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_entering_survives_the_dir_vanishing_under_it(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer's last-attempt cleanup deletes the job dir between a rank's mkdir and its open of
    the lock (seen once in the recovery drill as FileNotFoundError at start-up): the rank makes
    the dir again and holds the lock that is there."""
    real_open = os.open
    removed: list[str] = []

    def racing_open(path: Any, flags: int, *a: Any) -> int:
        if str(path).endswith("/lock") and not removed:
            removed.append(str(path))
            subprocess.run(["rm", "-rf", str(shm)], check=True)  # the peer's rmtree
        return real_open(path, flags, *a)

    monkeypatch.setattr(snapshot.os, "open", racing_open)
    snap = Snapshotter(dir=shm)
    monkeypatch.setattr(snapshot.os, "open", real_open)
    assert removed and snap.rank_dir.is_dir()
    lock = shm / "lock"
    assert os.stat(lock).st_ino == os.fstat(snap._lock_fd).st_ino  # the lock at the path


def test_last_attempt_cleanup_when_a_peer_removed_the_job_dir_meanwhile(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks of one node restore in their last attempt: each removes its rank dir, then
    the job dir if no rank dir is left. The peer removed the job dir between this rank's rmtree
    and its look into it (a stress run: FileNotFoundError out of restore, the job failed)."""
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    restart(monkeypatch, 1)  # the last allowed attempt
    import pathlib

    snap = Snapshotter(dir=shm)
    real_scandir = pathlib.Path._scandir  # type: ignore[attr-defined]

    def racing_scandir(path: Path) -> Any:
        if path == shm and not snap.rank_dir.exists():  # glob saw the dir; the peer removes it
            subprocess.run(["rm", "-rf", str(shm)], check=True)
        return real_scandir(path)

    monkeypatch.setattr(pathlib.Path, "_scandir", racing_scandir)
    assert snap.restore() is None  # nothing there; no FileNotFoundError from the cleanup
    assert not shm.exists()


class _Listed(list):  # type: ignore[type-arg]
    """A directory's entries, read in full, behaving as ``os.scandir``'s iterator."""

    def __enter__(self) -> _Listed:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass


def test_restore_when_a_peer_removes_its_rank_dir_meanwhile(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks of one node restore in their last attempt, each on its own (no process group
    initialised yet): the faster one's cleanup removed its rank dir right after the other had
    listed the job dir in its look for the newest lineage, and Path.glob's scandir of that
    listed rank dir raised FileNotFoundError out of restore (the job failed)."""
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    restart(monkeypatch, 1)  # the last allowed attempt
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    snap = Snapshotter(dir=shm)
    peer = shm / "rank-0"
    peer.mkdir()
    (peer / "slot-0").write_bytes(b"")
    real_scandir = os.scandir

    def racing_scandir(path: Any = ".") -> Any:
        listing_job_dir = isinstance(path, (str, os.PathLike)) and Path(path) == shm
        if listing_job_dir and peer.exists():  # listed; then the peer removes its own
            with real_scandir(path) as it:
                entries = _Listed(it)
            subprocess.run(["rm", "-rf", str(peer)], check=True)
            return entries
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", racing_scandir)
    assert snap.restore() is None  # nothing there; no FileNotFoundError
    assert not peer.exists() and not snap.rank_dir.exists()


def test_last_attempt_cleanup_keeps_a_dir_a_peer_is_entering(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last attempt's rank removes the job dir once no rank dir is left, but not while a
    live peer holds the lock (it has entered and not yet made its rank dir)."""
    import fcntl

    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    restart(monkeypatch, 1)  # the last allowed attempt
    snap = Snapshotter(dir=shm)
    entrant = os.open(shm / "lock", os.O_RDWR)
    fcntl.flock(entrant, fcntl.LOCK_SH)  # a peer between its flock and its rank dir
    try:
        assert snap.restore() is None  # nothing there; the last attempt then removes its own
        assert not snap.rank_dir.exists() and (shm / "lock").exists()
    finally:
        os.close(entrant)
    last = Snapshotter(dir=shm)
    assert last.restore() is None
    assert not shm.exists()  # nobody holds it any more: the dir goes
