"""Fail once, then succeed: global rank 0 of the first attempt exits 1 while its peers are still
running (they sleep, as a training job would; the launcher must stop them); every worker of a
later attempt exits 0 at once.

"First attempt" is a marker file in the cwd (one per benchmark run, shared by both agents on
2 nodes), not TORCHELASTIC_RESTART_COUNT: an agent restarted by its peer's re-rendezvous keeps
its own count at 0 in torchrun. argv[1] "clean" makes every attempt succeed at once.
"""

import os
import sys
import time

MARKER = "failed-once"

if sys.argv[1:2] == ["clean"] or os.path.exists(MARKER):
    sys.exit(0)
if os.environ["RANK"] == "0":
    with open(MARKER, "w"):
        pass
    sys.exit(1)
time.sleep(60)
