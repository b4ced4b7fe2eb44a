"""Worker of measure 17: the cost of committing one training state, three ways, interleaved.

``snapshot_cost.py MIB REPS DISK_DIR``: builds a model of MIB MiB of float32 parameters
(plain SGD: the state is the parameters, the RNG states and a step), then REPS times, round
robin: ``Snapshotter.commit`` (/dev/shm, two slots), ``torch.save`` of the same state to a file
on /dev/shm, ``torch.save`` to DISK_DIR (page cache) and the same with ``fsync`` (durable). One
``restore`` is timed at the end. Prints one JSON object: seconds per sample, bytes on /dev/shm.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from xrun.runtime.snapshot import Snapshotter

mib, reps, disk = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
torch.set_num_threads(1)  # a rank of a multi-worker node: one thread (torchrun's default)
os.environ["TORCHELASTIC_RESTART_COUNT"] = "0"
layers = max(1, mib // 4)  # 1024 x 1024 float32 = 4 MiB a layer
model = nn.Sequential(*(nn.Linear(1024, 1024, bias=False) for _ in range(layers)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
shm = Path(tempfile.mkdtemp(prefix="xrun-bench-snap-", dir="/dev/shm"))
snap = Snapshotter(dir=shm / "job")
snap.restore()


def state() -> dict[str, object]:
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1,
            "rng": torch.get_rng_state(), "py_rng": random.getstate()}  # fmt: skip


def save(path: Path, sync: bool) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state(), f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - t0


def commit(step: int) -> float:
    t0 = time.perf_counter()
    snap.commit(step, model=model, optimizer=opt)
    return time.perf_counter() - t0


commit(1)  # the first commit to each slot allocates it (once per job): not a step's cost
commit(2)
samples: dict[str, list[float]] = {k: [] for k in ("snapshot", "shm", "disk", "disk_fsync")}
for i in range(reps):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # a new state each round, as after a step
    samples["snapshot"].append(commit(3 + i))
    samples["shm"].append(save(shm / "save.pt", False))
    samples["disk"].append(save(disk / "save.pt", False))
    samples["disk_fsync"].append(save(disk / "save.pt", True))
used = sum(p.stat().st_blocks * 512 for p in (shm / "job").rglob("slot-*"))
saved = (shm / "save.pt").stat().st_size
snap.close()
os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
t0 = time.perf_counter()
got = Snapshotter(dir=shm / "job").restore(model, opt)
restore_s = time.perf_counter() - t0
assert got is not None
t0 = time.perf_counter()
torch.load(shm / "save.pt", weights_only=True)
load_s = time.perf_counter() - t0
state_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
for path in (shm / "save.pt", disk / "save.pt"):
    path.unlink()
Snapshotter(dir=shm / "job").close(remove=True)
os.rmdir(shm)
print(json.dumps({"samples": samples, "shm_bytes": used, "save_bytes": saved,
                  "state_bytes": state_bytes, "restore_s": restore_s, "load_s": load_s}))  # fmt: skip
