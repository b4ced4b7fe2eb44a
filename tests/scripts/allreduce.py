"""Worker script: a real torch gloo all_reduce of (rank + 1); writes OUT_DIR/allreduce.<rank>.json."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from the agent
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"allreduce.{dist.get_rank()}.json"), "w") as f:
    json.dump({"rank": dist.get_rank(), "sum": t.item()}, f)
dist.barrier()  # every rank is past its last collective
# torch 2.13's gloo teardown (destroy_process_group / interpreter exit) can deadlock on a busy
# host, see examples/train_ddp.py: nothing is left to clean up, so leave without it.
os._exit(0)
