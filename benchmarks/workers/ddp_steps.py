"""Measure 18's worker: a DDP training loop on gloo, steps of ``STEP_S`` seconds (``step S`` on
rank 0 after each step: a step is a DDP all_reduce, so it completes only with the full world),
the start line of examples/train_ddp.py. Arguments: total steps (default 100000)."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEP_S = 0.1


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"rank {rank}/{world}: started (restart {restart})", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        opt.zero_grad()
        model(torch.ones(32, 16)).sum().backward()
        opt.step()
        if rank == 0:
            print(f"step {step}", flush=True)
        time.sleep(STEP_S)
    dist.barrier()
    os._exit(0)  # as examples/train_ddp.py: gloo's teardown can hang on a busy host


if __name__ == "__main__":
    main()
