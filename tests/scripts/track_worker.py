"""A worker that tracks through TorchX's import and fails its first attempts (standard
library only; the one-run-per-job tests).

Usage: track_worker.py FAIL_UNTIL OUT_DIR [NWORKERS]

Every worker opens the job's run (``from torchx.tracker import app_run_from_env``: xrun's
stand-in when TorchX is not installed), writes OUT_DIR/ready.<RANK>.<attempt> holding its
``XRUN_RUN_ID``, and waits for the NWORKERS (default WORLD_SIZE) ready files of its attempt, so
rank 0 has recorded the attempt before any worker fails. While the attempt (the rendezvous
round) is below FAIL_UNTIL every worker exits 1; then
rank 0 records ``done`` and an artifact, and all exit 0.
"""

import os
import sys
import time

from torchx.tracker import app_run_from_env

fail_until, out = int(sys.argv[1]), sys.argv[2]
rank = os.environ.get("RANK", "0")
# The start of the job: the rendezvous round, the same in every worker (an agent's
# TORCHELASTIC_RESTART_COUNT skips membership restarts, so the agents' counts can differ).
attempt = int(os.environ.get("XRUN_ROUND", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
n = int(sys.argv[3]) if len(sys.argv) > 3 else int(os.environ.get("WORLD_SIZE", "1"))

run = app_run_from_env()
with open(os.path.join(out, f"ready.{rank}.{attempt}"), "w") as f:
    f.write(os.environ.get("XRUN_RUN_ID", "") + " " + run.job_id())
deadline = time.monotonic() + 120
while sum(os.path.exists(os.path.join(out, f"ready.{r}.{attempt}")) for r in range(n)) < n:
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
if attempt < fail_until:
    sys.exit(1)
if rank == "0":
    # what this agent counted (the tracker records it as the attempt's restart_count)
    with open(os.path.join(out, "restart_count"), "w") as f:
        f.write(os.environ.get("TORCHELASTIC_RESTART_COUNT", ""))
    run.add_metadata(done=True, loss=0.125)
    run.add_artifact("result", os.path.join(out, "result.txt"), {"attempt": attempt})
