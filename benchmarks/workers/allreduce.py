"""A real distributed step: gloo process group over env://, one all_reduce, checked."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1024) * (dist.get_rank() + 1)
dist.all_reduce(t)
world = dist.get_world_size()
expected = world * (world + 1) / 2
if not bool((t == expected).all()):
    raise SystemExit(f"rank {os.environ['RANK']}: all_reduce gave {t[0].item()}, not {expected}")
dist.barrier()  # every rank is past its last collective
# torch 2.13's gloo teardown (destroy_process_group / interpreter exit) can deadlock on a busy
# host, see examples/train_ddp.py: nothing is left to clean up, so leave without it.
os._exit(0)
