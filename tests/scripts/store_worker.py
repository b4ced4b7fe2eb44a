"""Worker script for the agent-store tests: torch.distributed over the agent's store, unchanged.

Usage: store_worker.py OUT_DIR MODE [ARG]. Every worker writes
OUT_DIR/<mode>.<rank>.<restart>.json with what it saw. Modes:

  collectives   init_process_group("gloo") from the env (env://), all_reduce, new_group and an
                all_reduce in it, barrier, monitored_barrier, then a torch.distributed.checkpoint
                save and load (ARG: the checkpoint dir)
  tcp-init      init_process_group("gloo", init_method="tcp://$MASTER_ADDR:$MASTER_PORT") with
                RANK/WORLD_SIZE passed explicitly, and an all_reduce
  attempts      before joining the group, a TCPStore client of $MASTER_ADDR:$MASTER_PORT looks
                for the previous attempt's key and leaves one of its own; then gloo and an
                all_reduce; global rank 0 fails after it on restart 0
  snoop         a TCPStore client lists the keys it can see and asks for the rendezvous' own
                keys (ARG: the run id)
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)


def out_file(out: str, mode: str) -> str:
    return os.path.join(
        out, f"{mode}.{os.environ['RANK']}.{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
    )


def client() -> dist.TCPStore:
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=TIMEOUT
    )


def all_reduce_sum(group: object = None) -> float:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t, group=group)
    return t.item()


def collectives(arg: str) -> dict:
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", timeout=TIMEOUT)
    total = all_reduce_sum()
    group = dist.new_group(list(range(dist.get_world_size())))
    in_group = all_reduce_sum(group)
    dist.barrier()
    dist.monitored_barrier(timeout=TIMEOUT)
    state = {"weights": torch.arange(4.0) + dist.get_rank()}
    dcp.save(state, checkpoint_id=arg)
    loaded = {"weights": torch.zeros(4)}
    dcp.load(loaded, checkpoint_id=arg)
    return {"sum": total, "group_sum": in_group, "loaded": loaded["weights"].tolist()}


def tcp_init(arg: str) -> dict:
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=TIMEOUT,
    )
    return {"sum": all_reduce_sum(), "master": [addr, port]}


def attempts(arg: str) -> dict:
    store = client()
    rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    # Our key of attempt 0: nobody else writes it, so only attempt 0's store could hold it.
    saw = {"keys": sorted(store.list_keys()), "left_by_attempt_0": store.check([f"mine.0.{rank}"])}
    store.set(f"mine.{restart}.{rank}", rank)
    dist.init_process_group("gloo", timeout=TIMEOUT)
    saw["sum"] = all_reduce_sum()
    return saw


def snoop(run_id: str) -> dict:
    store = client()
    store.set("worker-key", "x")
    rdzv = [f"{run_id}/rdzv/cur", f"{run_id}/rdzv/0/world", "xrun/host_run_id"]
    return {
        "keys": sorted(store.list_keys()),
        "num_keys": store.num_keys(),
        # torch's client puts "/" before every key: these are the names it would ask for
        "rdzv_visible": [store.check([k]) for k in rdzv],
    }


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else ""
    result = {
        "collectives": collectives,
        "tcp-init": tcp_init,
        "attempts": attempts,
        "snoop": snoop,
    }[mode](arg)
    result["env"] = {
        k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
    }
    with open(out_file(out, mode), "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.barrier()  # every rank is past its last collective
    if (
        mode == "attempts"
        and os.environ["RANK"] == "0"
        and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    ):
        os._exit(3)  # the scripted failure: the agents restart the group
    # torch 2.13's gloo teardown can deadlock on a busy host (see examples/train_ddp.py)
    os._exit(0)


if __name__ == "__main__":
    main()
