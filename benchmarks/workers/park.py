"""A torch-free stand-in for workers/hang.py, for images without torch (docker's
xrun-python): rank K (argv[1]) says ``hanging`` and sleeps in ``stuck_here``; every other rank
sleeps in ``wait_for_peers``, as ranks blocked in a collective would."""

import os
import sys
import time


def stuck_here() -> None:
    print(f"hanging rank {os.environ['RANK']}", flush=True)
    while True:
        time.sleep(3600)


def wait_for_peers() -> None:
    print(f"rank {os.environ['RANK']} waits for its peers", flush=True)
    while True:
        time.sleep(3600)


if int(os.environ["RANK"]) == int(sys.argv[1]):
    stuck_here()
wait_for_peers()
