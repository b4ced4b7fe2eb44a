"""A DDP worker for the ``--recover warm`` tests: real gloo, one step every ``--step-s``.

Prints ``rank R/W: started (attempt N) pid P warm W`` (W: was torch imported before this
script ran, i.e. did a warm pool interpreter run it) and, on rank 0, ``step S t T`` after each
step (a step is a DDP all_reduce: it completes only with the full world).

``--die RANK:STEP:ATTEMPT[,...]``: that rank SIGKILLs itself at that step of that restart, once
every rank's agent has ``--wait-warm`` ready pool interpreters (so the fault meets a full pool).
``--fail-at-start ATTEMPT``: rank 0 raises at the start of that attempt (a second fault during
a recovery). ``--raise-rank R``: rank R raises ValueError at step 2 of attempt 0 (after ``--wait-warm``),
after printing a line to each stream (what the logs tests compare); ``@record`` writes its
error file.
``--stubborn``: every rank ignores SIGTERM and, when a step fails (a peer died), hangs instead
of exiting: a rank that handles SIGTERM itself, stuck in a collective.
"""

from __future__ import annotations

import sys

WARM = "torch" in sys.modules  # before any import of ours: a pool interpreter had it

import argparse  # noqa: E402
import glob  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from xrun.runtime.errors import record  # noqa: E402


def ready_children(parent: int) -> int:
    """Ready pool interpreters of the agent ``parent`` (their marks in the pool's folder)."""
    n = 0
    for mark in glob.glob(os.path.join(tempfile.gettempdir(), "xrun-warm-*", "ready.*")):
        pid = mark.rsplit(".", 1)[1]
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                    n += 1
        except (OSError, ValueError, IndexError):
            pass
    return n


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--die", default="")
    p.add_argument("--wait-warm", type=int, default=0)
    p.add_argument("--fail-at-start", type=int, default=-1)
    p.add_argument("--raise-rank", type=int, default=-1)
    p.add_argument("--stubborn", action="store_true")
    args = p.parse_args()
    if args.stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The job's attempt, the same on every node (an agent's TORCHELASTIC_RESTART_COUNT counts
    # its own failures only: a node whose workers did not fail stays at 0).
    restart = int(os.environ["XRUN_ROUND"])
    print(f"rank {rank}/{world}: started (attempt {restart}) pid {os.getpid()} warm {WARM}")
    if restart == args.fail_at_start and rank == 0:
        raise RuntimeError("a second fault, during the recovery")

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dies = [tuple(map(int, d.split(":"))) for d in args.die.split(",") if d]
    for step in range(args.steps):
        raising = args.raise_rank >= 0 and restart == 0 and step == 2
        if args.wait_warm and (raising or any(s == step and r == restart for _, s, r in dies)):
            deadline = time.monotonic() + 300
            while ready_children(os.getppid()) < args.wait_warm and time.monotonic() < deadline:
                time.sleep(0.2)
            dist.barrier()  # every agent's pool is full: now the fault
        if any(d == (rank, step, restart) for d in dies):
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == args.raise_rank and restart == 0 and step == 2:
            print(f"rank {rank}: out before the error")
            print(f"rank {rank}: err before the error", file=sys.stderr)
            raise ValueError(f"rank {rank} fails on purpose")
        try:
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            opt.step()
        except Exception:
            if not args.stubborn:
                raise
            time.sleep(3600)
        if rank == 0:
            print(f"step {step} t {time.time():.6f}")
        time.sleep(args.step_s)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # as examples/train_ddp.py: gloo's teardown can hang on a busy host


if __name__ == "__main__":
    main()
