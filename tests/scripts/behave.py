"""Worker script with a scripted behaviour, for the agent tests (standard library only).

Usage: behave.py OUT_DIR ACTION...  Every worker first appends one JSON line (its env, pid and
time) to OUT_DIR/events.jsonl, then performs the actions in order:

  fail-rank:R        local rank R raises RuntimeError (recorded by @record) on restart 0 only
  fail-rank-always:R local rank R raises RuntimeError on every attempt
  exit-rank:R:C      local rank R exits with code C (no error file)
  kill-rank:R        local rank R kills itself with SIGKILL
  sleep:S            sleep S seconds
  sleep-unless-world:W:S  sleep S seconds unless WORLD_SIZE is W
  sleep-env:VAR      sleep $VAR seconds (0 when unset): one agent's workers slower than another's
  trap-term          on SIGTERM write OUT_DIR/term.<RANK> and exit 0
  ready              write OUT_DIR/ready.<RANK>.<restart> (the test waits for it)
  barrier:N          ready, then wait until N workers of this restart count are ready
  port-race-once     local rank 0 fails once (marker file) with "Address already in use"
  print:TEXT         print TEXT to stdout and "err:TEXT" to stderr
"""

import json
import os
import signal
import sys
import time

from xrun.runtime.errors import record

# The agent also runs this file with --run-path (runpy), where its folder is not on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_env import KEYS  # noqa: E402


def write(path: str, data: object) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


@record
def main() -> None:
    out, actions = sys.argv[1], sys.argv[2:]
    rank, lr = os.environ["RANK"], int(os.environ["LOCAL_RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    line = json.dumps(
        {**{k: os.environ.get(k) for k in KEYS}, "pid": os.getpid(), "time": time.time()}
    )
    # One O_APPEND write per line: lines of concurrent workers never interleave.
    fd = os.open(os.path.join(out, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (line + "\n").encode())
    os.close(fd)
    for action in actions:
        verb, _, arg = action.partition(":")
        if verb == "fail-rank" and int(arg) == lr and restart == 0:
            raise RuntimeError(f"scripted failure of rank {rank}")
        if verb == "fail-rank-always" and int(arg) == lr:
            raise RuntimeError(f"scripted failure of rank {rank}")
        if verb == "exit-rank" and int(arg.split(":")[0]) == lr:
            sys.exit(int(arg.split(":")[1]))
        if verb == "kill-rank" and int(arg) == lr:
            os.kill(os.getpid(), signal.SIGKILL)
        if verb == "sleep":
            time.sleep(float(arg))
        if verb == "sleep-env":
            time.sleep(float(os.environ.get(arg, "0")))
        if verb == "sleep-unless-world":
            world, seconds = arg.split(":")
            if os.environ["WORLD_SIZE"] != world:
                time.sleep(float(seconds))
        if verb == "trap-term":

            def on_term(signum: int, frame: object) -> None:
                write(os.path.join(out, f"term.{rank}"), signum)
                os._exit(0)

            signal.signal(signal.SIGTERM, on_term)
        if verb in ("ready", "barrier"):
            write(os.path.join(out, f"ready.{rank}.{restart}"), os.getpid())
        if verb == "barrier":
            names = [f"ready.{r}.{restart}" for r in range(int(arg))]
            while not all(os.path.exists(os.path.join(out, n)) for n in names):
                time.sleep(0.01)
        if verb == "port-race-once" and lr == 0:
            marker = os.path.join(out, "port-race")
            if not os.path.exists(marker):
                write(marker, 1)
                raise OSError(98, "Address already in use")
        if verb == "print":
            print(arg)
            print(f"err:{arg}", file=sys.stderr)


if __name__ == "__main__":
    main()
