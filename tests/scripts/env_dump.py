"""Worker script: dump the torchelastic env contract (and argv) as one JSON file per rank.

Usage: env_dump.py OUT_DIR [extra args...]; writes OUT_DIR/<RANK>.<TORCHELASTIC_RESTART_COUNT>.json.
Standard library only, so the tests that use it do not pay for a torch import.
"""

import json
import os
import sys

from worker_env import KEYS as CONTRACT

KEYS = [*CONTRACT, "PYTHONUNBUFFERED"]

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
