"""Worker script without torch: rank K (argv[1]) parks in ``stuck_here``, every other rank in
``wait_for_peers``: what a hung collective looks like from outside, in an image without torch."""

import os
import sys
import time


def stuck_here() -> None:
    while True:
        time.sleep(3600)


def wait_for_peers() -> None:
    while True:
        time.sleep(3600)


print(f"rank {os.environ['RANK']} parked", flush=True)
if int(os.environ["RANK"]) == int(sys.argv[1]):
    stuck_here()
wait_for_peers()
