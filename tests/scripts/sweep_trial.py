"""Worker script of the sweep tests: what a trial saw, and when it ran.

Usage: sweep_trial.py OUT_DIR SECONDS [script args...]. Writes OUT_DIR/start.<trial> and
OUT_DIR/end.<trial> (wall-clock times), OUT_DIR/env.<trial>.<rank>.<restart>.json (the sweep's
env and the script's arguments), sleeps SECONDS, and exits with the code in XRUN_SWEEP_RC
(0 when unset); with XRUN_SWEEP_FAIL_FIRST=1 only its first attempt exits 1.
Standard library only.
"""

import json
import os
import sys
import time

out, seconds, args = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
trial = os.environ["XRUN_TRIAL_INDEX"]
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
with open(os.path.join(out, f"start.{trial}"), "w") as f:
    f.write(repr(time.time()))
env = {k: v for k, v in os.environ.items() if k.startswith("XRUN_SWEEP") or k == "XRUN_TRIAL_INDEX"}
with open(os.path.join(out, f"env.{trial}.{os.environ.get('RANK', '0')}.{restart}.json"), "w") as f:
    json.dump({"env": env, "argv": args}, f)
print(f"trial {trial} args {' '.join(args)}", flush=True)
time.sleep(seconds)
with open(os.path.join(out, f"end.{trial}"), "w") as f:
    f.write(repr(time.time()))
if os.environ.get("XRUN_SWEEP_FAIL_FIRST") == "1" and restart == "0":
    sys.exit(1)
sys.exit(int(os.environ.get("XRUN_SWEEP_RC", "0")))
