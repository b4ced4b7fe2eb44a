"""Worker script: dump the torchelastic env contract (and argv) as one JSON file per rank.

Usage: env_dump.py OUT_DIR [extra args...]; writes OUT_DIR/<RANK>.<TORCHELASTIC_RESTART_COUNT>.json.
Standard library only, so the tests that use it do not pay for a torch import.
"""

import json
import os
import sys

KEYS = (
    "LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE "
    "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
    "TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCH_NCCL_ASYNC_ERROR_HANDLING "
    "TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS PYTHONUNBUFFERED"
).split()

out_dir = sys.argv[1]
data: dict[str, object] = {k: os.environ.get(k) for k in KEYS}
data["argv"] = sys.argv[2:]
data["orig_argv"] = sys.orig_argv[1:]  # shows the interpreter flags, e.g. "-u"
data["pid"] = os.getpid()
name = f"{os.environ['RANK']}.{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
tmp = os.path.join(out_dir, name + ".tmp")
with open(tmp, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
os.replace(tmp, os.path.join(out_dir, name))
