"""A gloo job where rank K (argv[1]) stops joining the all_reduce at step 3: it says
``hanging`` and sleeps in ``stuck_here``, while the other ranks block in ``all_reduce``."""

import os
import sys
import time

import torch
import torch.distributed as dist

HANG_STEP = 3


def stuck_here() -> None:
    print(f"hanging rank {dist.get_rank()}", flush=True)
    while True:
        time.sleep(3600)


dist.init_process_group("gloo")
t = torch.ones(1)
for step in range(1000):
    print(f"step {step}", flush=True)
    if step == HANG_STEP and dist.get_rank() == int(sys.argv[1]):
        stuck_here()
    dist.all_reduce(t)
    time.sleep(0.05)
os._exit(0)  # torch 2.13's gloo teardown can deadlock on a busy host: nothing to clean up
