"""Worker script with a scripted behaviour, for the agent tests (standard library only).

Usage: behave.py OUT_DIR ACTION...  Every worker first appends one JSON line (its env, pid and
time) to OUT_DIR/events.jsonl, then performs the actions in order:

  fail-rank:R        local rank R raises RuntimeError (recorded by @record) on restart 0 only
  fail-rank-always:R local rank R raises RuntimeError on every attempt
  fail-on-turn:P:N   raise on the job's attempts k with k % 2 == P, where k counts the worlds of N
                     workers started so far (events.jsonl's lines): two nodes failing in turn
  exit-rank:R:C      local rank R exits with code C (no error file)
  kill-rank:R        local rank R kills itself with SIGKILL
  sleep:S            sleep S seconds
  sleep-unless-world:W:S  sleep S seconds unless WORLD_SIZE is W
  sleep-env:VAR      sleep $VAR seconds (0 when unset): one agent's workers slower than another's
  trap-term          on SIGTERM write OUT_DIR/term.<RANK> and exit 0
  slow-term:S        on SIGTERM take S seconds to stop (a checkpoint), then write the time to
                     OUT_DIR/stopped.<pid> and exit 0
  ready              write OUT_DIR/ready.<RANK>.<restart> (the test waits for it)
  barrier:N          ready, then wait until N workers of this restart count are ready
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


class Worker:
    """This worker's identity and the scripted actions (``verb:arg``), one method per verb."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.rank = os.environ["RANK"]
        self.lr = int(os.environ["LOCAL_RANK"])
        self.restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    def fail_rank(self, arg: str) -> None:
        if int(arg) == self.lr and self.restart == 0:
            raise RuntimeError(f"scripted failure of rank {self.rank}")

    def fail_rank_always(self, arg: str) -> None:
        if int(arg) == self.lr:
            raise RuntimeError(f"scripted failure of rank {self.rank}")

    def fail_on_turn(self, arg: str) -> None:
        parity, n = (int(x) for x in arg.split(":"))
        with open(os.path.join(self.out, "events.jsonl")) as f:
            attempt = (sum(1 for _ in f) - 1) // n  # our own line is in already
        if attempt % 2 == parity:
            raise RuntimeError(f"scripted failure on attempt {attempt}")

    def exit_rank(self, arg: str) -> None:
        rank, code = arg.split(":")
        if int(rank) == self.lr:
            sys.exit(int(code))

    def kill_rank(self, arg: str) -> None:
        if int(arg) == self.lr:
            os.kill(os.getpid(), signal.SIGKILL)

    def sleep(self, arg: str) -> None:
        time.sleep(float(arg))

    def sleep_env(self, arg: str) -> None:
        time.sleep(float(os.environ.get(arg, "0")))

    def sleep_unless_world(self, arg: str) -> None:
        world, seconds = arg.split(":")
        if os.environ["WORLD_SIZE"] != world:
            time.sleep(float(seconds))

    def trap_term(self, arg: str) -> None:
        def on_term(signum: int, frame: object) -> None:
            write(os.path.join(self.out, f"term.{self.rank}"), signum)
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)

    def slow_term(self, arg: str) -> None:
        def on_term(signum: int, frame: object) -> None:
            time.sleep(float(arg))
            write(os.path.join(self.out, f"stopped.{os.getpid()}"), time.time())
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)

    def ready(self, arg: str) -> None:
        write(os.path.join(self.out, f"ready.{self.rank}.{self.restart}"), os.getpid())

    def barrier(self, arg: str) -> None:
        self.ready(arg)
        names = [f"ready.{r}.{self.restart}" for r in range(int(arg))]
        while not all(os.path.exists(os.path.join(self.out, n)) for n in names):
            time.sleep(0.01)

    def print(self, arg: str) -> None:
        # One write per line: workers run under ``python -u`` (as torchrun starts them), where
        # print() writes the text and its newline separately, so two workers sharing the
        # agent's stdout could interleave mid-line ("rprp\n\n") under any launcher.
        sys.stdout.write(f"{arg}\n")
        sys.stderr.write(f"err:{arg}\n")


@record
def main() -> None:
    out, actions = sys.argv[1], sys.argv[2:]
    line = json.dumps(
        {**{k: os.environ.get(k) for k in KEYS}, "pid": os.getpid(), "time": time.time()}
    )
    # One O_APPEND write per line: lines of concurrent workers never interleave.
    fd = os.open(os.path.join(out, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (line + "\n").encode())
    os.close(fd)
    worker = Worker(out)
    for action in actions:
        verb, _, arg = action.partition(":")
        getattr(worker, verb.replace("-", "_"))(arg)


if __name__ == "__main__":
    main()
