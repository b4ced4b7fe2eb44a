"""One rank of tests/runtime/test_snapshot_handover.py: DDP (gloo, CPU) on 2 "nodes" x 2 ranks,
each node's snapshots in its own dir (argv: out dir, phase, steps to commit, steps to run on).

The batches come from the global RNG, which each rank seeds differently: the parameters after
the steps that follow a restore are bit-identical to an undisturbed run's only if every rank got
its own RNG state back (and the model and optimizer state of the step).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from xrun.runtime.snapshot import Restored, Snapshotter


def _extra(rank: int, step: int) -> dict[str, object]:
    # rank 3's part (node 1: lost, then handed back) is bigger than one buddy message (snapshot_peers.CAPACITY): two go
    return {"rank": rank, "pos": step, "pad": "x" * (70_000 if rank == 3 else 10)}


def main() -> None:
    out, phase, commits, more = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    node = rank // int(os.environ["LOCAL_WORLD_SIZE"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # optimizer state: moments, step
    torch.manual_seed(1000 + rank)  # each rank's own data stream
    snap = Snapshotter(dir=out / f"node-{node}", replicated=True)
    restored = snap.restore(model, opt, fallback=lambda: "fallback")
    start = restored.step if isinstance(restored, Restored) else 0
    extra = restored.extra if isinstance(restored, Restored) else None
    ddp = DistributedDataParallel(model)
    # DDP regroups its buckets after its first backward pass (which changes gloo's summation
    # order): one throwaway pass, as in examples/train_ddp.py, so every run trains regrouped.
    ddp(torch.ones(1, 8)).sum().backward()
    opt.zero_grad(set_to_none=True)
    step = start
    for _ in range(commits + more):
        opt.zero_grad()
        ddp(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        step += 1
        if step - start <= commits:
            snap.commit(step, model=model, optimizer=opt, extra=_extra(rank, step))
    params = [p.detach().clone() for p in model.parameters()]
    record = {
        "restored": restored if not isinstance(restored, Restored) else restored.step,
        "extra": extra,
        "step": step,
        "params": [p.flatten().tolist() for p in params],
        "next_draw": torch.rand(1).item(),  # the RNG after the run
    }
    (out / f"{phase}-rank-{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # see examples/train_ddp.py: gloo's teardown can hang on a busy host


if __name__ == "__main__":
    main()
