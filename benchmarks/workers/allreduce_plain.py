"""A user's gloo script done by the book: env:// init, one all_reduce (checked), a barrier,
destroy_process_group, then a normal interpreter exit (no os._exit): torch tears everything
down itself. The reliability measure runs it: a worker that dies at exit (SIGABRT,
"terminate called without an active exception") shows there.

Without the barrier and destroy_process_group, torch 2.13's gloo aborts at exit now and then
under any launcher (measured on this host: 7 of 30 runs under torchrun, 6 of 30 under xrun):
that is torch's teardown, not the store, so the measure does not count it against xrun."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
world = dist.get_world_size()
if t[0].item() != world * (world + 1) / 2:
    raise SystemExit(f"all_reduce gave {t[0].item()}, not {world * (world + 1) / 2}")
dist.barrier()
dist.destroy_process_group()
