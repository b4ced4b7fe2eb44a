"""Run a distributed function from Python with ``xrun.runtime.launch`` (no torchrun, no CLI).

Each worker does a gloo ``all_reduce`` of ``rank + 1`` and returns the sum; ``launch`` returns
``{global_rank: result}`` for the workers of the calling agent. Run it::

    python examples/launch_notebook.py

In a notebook, put ``all_reduce_sum`` in an importable module (spawned workers cannot import a
function defined in a cell) or pass ``start_method="fork"``.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from xrun.runtime import LaunchConfig, launch


def all_reduce_sum(scale: float) -> float:
    import torch  # imported in the workers only: the agent itself never imports torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the agent
    try:
        t = torch.tensor([scale * (dist.get_rank() + 1)])
        dist.all_reduce(t)
        return float(t.item())
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    # 1 node x 2 workers, standalone: a private rendezvous on a free localhost port.
    print("1x2:", dict(sorted(launch(LaunchConfig(nproc_per_node=2), all_reduce_sum)(1.0).items())))

    # 2 agents x 2 workers: two "nodes" (here two threads of this process) meet at an endpoint.
    cfg = LaunchConfig(
        min_nodes=2,
        max_nodes=2,
        nproc_per_node=2,
        run_id="notebook",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
    )
    results: list[dict[int, Any]] = []
    nodes = [
        threading.Thread(target=lambda: results.append(launch(cfg, all_reduce_sum)(1.0)))
        for _ in range(2)
    ]
    for t in nodes:
        t.start()
    for t in nodes:
        t.join()
    merged = {rank: value for part in results for rank, value in part.items()}
    print("2x2:", dict(sorted(merged.items())))  # 1+2+3+4 = 10.0 on every rank


if __name__ == "__main__":
    main()
