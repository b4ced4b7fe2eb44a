"""Worker script: every rank raises ValueError, rank 0 first (at 2.0 s), the others 0.25 s later:
in a 2x2 job the replica holding rank 0 fails first, and its peer learns of it (or fails too)."""

import os
import time

rank = int(os.environ["RANK"])
time.sleep(2.0 if rank == 0 else 2.25)
raise ValueError(f"boom from rank {rank}")
