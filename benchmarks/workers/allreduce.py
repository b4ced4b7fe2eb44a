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
dist.destroy_process_group()
