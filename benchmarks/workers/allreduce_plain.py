"""A user's plain gloo script: env:// init, one all_reduce, checked, then a normal interpreter
exit (no destroy_process_group, no os._exit): torch tears the group down itself, as most
scripts let it. The reliability measure runs it: a worker that dies at exit (SIGABRT,
"terminate called without an active exception") shows there."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
world = dist.get_world_size()
if t[0].item() != world * (world + 1) / 2:
    raise SystemExit(f"all_reduce gave {t[0].item()}, not {world * (world + 1) / 2}")
