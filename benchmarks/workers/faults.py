"""A worker that fails on purpose, for the root-cause tests and the fault benchmark (measure 15).

Usage: faults.py FAULT RANK [OUT_DIR]. Global rank RANK commits FAULT; every other rank does
``$FAULT_PEERS`` (default ``sleep``: a healthy rank the agent must stop), and every rank first
writes its pid to ``OUT_DIR/pid.<rank>`` (so a test can kill it from outside) when OUT_DIR is
given.

Faults: ``raise`` (ValueError, no @record), ``chained`` (an exception raised while handling
another), ``record`` (RuntimeError under @record), ``exit3`` (sys.exit(3)), ``exit7`` (os._exit(7)),
``segv`` (a NULL read), ``abort`` (abort()), ``oom`` (allocate until the memory limit is hit),
``sleep`` (nothing: the test sends the signal), ``ignore-term`` (ignores SIGTERM, then sleeps),
``expire`` (torch's FileTimerClient armed for 1 s, then a hang), ``interrupt`` (KeyboardInterrupt).
"""

import os
import signal
import sys
import time


def bad_batch(batch: int) -> None:
    raise ValueError(f"bad shape in batch {batch}")


def chained() -> None:
    try:
        {}["lr"]  # noqa: B018 - the KeyError is the point
    except KeyError as e:
        raise RuntimeError("config has no learning rate") from e


def record_fail() -> None:
    from xrun.runtime.errors import record

    @record
    def main() -> None:
        raise RuntimeError("recorded failure")

    main()


def oom() -> None:
    hog = []
    while True:  # 64 MiB pages touched at once, until the OOM killer ends it
        hog.append(bytearray(b"x" * (64 << 20)))


def expire() -> None:
    from torch.distributed.elastic.timer import FileTimerClient, expires

    client = FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"])
    with expires(after=1, scope="train_step", client=client):
        time.sleep(3600)  # a hang: the timer's server kills it after 1 s


def interrupt() -> None:
    raise KeyboardInterrupt  # no signal anywhere: Python still exits by SIGINT


FAULTS = {
    "raise": lambda: bad_batch(7),
    "chained": chained,
    "record": record_fail,
    "exit3": lambda: sys.exit(3),
    "exit7": lambda: os._exit(7),
    "segv": lambda: __import__("ctypes").string_at(0),
    "abort": os.abort,
    "oom": oom,
    "sleep": lambda: time.sleep(3600),
    "ignore-term": lambda: (signal.signal(signal.SIGTERM, signal.SIG_IGN), time.sleep(3600)),
    "expire": expire,
    "interrupt": interrupt,
}


def main() -> None:
    fault, rank = sys.argv[1], int(sys.argv[2])
    me = int(os.environ["RANK"])
    if len(sys.argv) > 3:
        path = os.path.join(sys.argv[3], f"pid.{me}")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    if me == rank:
        time.sleep(0.3)  # the others are up: a failure with healthy peers to stop
        FAULTS[fault]()
    FAULTS[os.environ.get("FAULT_PEERS", "sleep")]()
    time.sleep(3600)


if __name__ == "__main__":
    main()
