"""Worker script: a gloo job where one rank stops joining the all_reduce at a given step.

``hang.py STEPS [--hang-rank K] [--hang-step S] [--fail] [--quiet] [--beat]``: every rank
prints ``step i`` and all_reduces STEPS times; at step S rank K instead calls ``stuck_here``
(sleeps for ever; with ``--fail`` it exits 1), so the others block in ``all_reduce`` (with
``--others-wait``: sleep in ``waiting_here`` first, out of any collective).
``--quiet`` prints nothing after start-up, ``--beat`` calls xrun's ``beat()`` every step
(a silent but healthy worker). Without ``--hang-rank`` nothing hangs.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("steps", type=int)
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--hang-step", type=int, default=3)
p.add_argument("--fail", action="store_true")
p.add_argument("--quiet", action="store_true")
p.add_argument("--beat", action="store_true")
p.add_argument("--others-wait", action="store_true")
p.add_argument("--step-s", type=float, default=0.05)
a = p.parse_args()


def stuck_here() -> None:
    if a.fail:
        print(f"rank {dist.get_rank()} fails", file=sys.stderr, flush=True)
        os._exit(1)
    while True:
        time.sleep(3600)


def waiting_here() -> None:
    time.sleep(60)


def beat() -> None:
    if a.beat:
        from xrun.runtime.diagnose.beat import beat as xrun_beat

        xrun_beat()


def say(line: str) -> None:
    # One write per line: under PYTHONUNBUFFERED=1 print() writes "step 2" and "\n" apart, and
    # two ranks' pieces interleave on the pipe they share ("step 2step 2").
    os.write(1, f"{line}\n".encode())


dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for step in range(a.steps):
    if not a.quiet:
        say(f"step {step}")
    beat()
    if step == a.hang_step and rank == a.hang_rank:
        stuck_here()
    if step == a.hang_step and a.others_wait:
        waiting_here()
    dist.all_reduce(t)
    time.sleep(a.step_s)
say("done")
# torch 2.13's gloo teardown can deadlock on a busy host (see allreduce.py): leave without it.
os._exit(0)
