"""Fail once, then succeed: on the first attempt global rank 0 waits until every worker has
started, then exits 1 while its peers sleep (as a training job would: the launcher must stop
them); every worker of a later attempt exits 0 at once.

"First attempt" is a marker file in the cwd (one per benchmark run, shared by both agents on
2 nodes), not TORCHELASTIC_RESTART_COUNT: an agent restarted by its peer's re-rendezvous keeps
its own count at 0 in torchrun. Rank 0 writes the marker only once every worker has checked it
(``started-<rank>`` files), so no first-attempt worker can mistake itself for a later one.
argv[1] "clean" makes every attempt succeed at once (the run the failure is compared with).
"""

import os
import sys
import time

MARKER = "failed-once"

if sys.argv[1:2] == ["clean"] or os.path.exists(MARKER):
    sys.exit(0)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(f"started-{rank}", "w"):
    pass
if rank == 0:
    while not all(os.path.exists(f"started-{r}") for r in range(world)):
        time.sleep(0.001)
    with open(MARKER, "w"):
        pass
    sys.exit(1)
time.sleep(60)
