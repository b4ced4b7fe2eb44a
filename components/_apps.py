"""The replica side of ``utils.booth`` and ``metrics.tensorboard``: ``python3 -m
xrun.components._apps booth|monitor ...`` (the CLI never imports it).

- ``booth --x1 X1 --x2 X2 [--trial_idx N] [--tracker_base URL]``: evaluates the booth
  function and stores ``{"booth_eval": value}`` under key ``N`` of the tracker base, as TorchX's
  ``FsspecResultTracker`` stores a trial's results (a pretty-printed JSON file named ``N``), so
  TorchX's tracker (and HPO code reading it) finds it; it prints the value too.
- ``monitor [--timeout S] [--start_on_file URL] [--exit_on_file URL] [--poll_rate S]
  [--kill_timeout S] -- PROGRAM ARGS...``: TorchX's process monitor: wait for
  ``start_on_file`` (exit 34 on timeout), run the program, stop it (SIGTERM, SIGKILL after
  ``kill_timeout``) on ``timeout`` or once ``exit_on_file`` exists; exit with its code.

Paths are fsspec URLs; a plain local path works without fsspec (a python3-only image).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TIMEOUT_EXIT_CODE = 34  # TorchX's process monitor's, when the start file never came


def booth_value(x1: float, x2: float) -> float:
    return (x1 + 2 * x2 - 7) ** 2 + (2 * x1 + x2 - 5) ** 2


def _exists(url: str) -> bool:
    if "://" not in url:
        return os.path.exists(url)
    import fsspec  # only for a URL: a python3-only image runs local paths

    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.exists(path))


def _put(base: str, key: str, data: bytes) -> None:
    if "://" not in base:
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, key), "wb") as f:
            f.write(data)
        return
    import fsspec

    fsspec.get_mapper(base, create=True)[key] = data


def booth(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="booth", description="evaluates the booth function")
    p.add_argument("--x1", type=float, required=True)
    p.add_argument("--x2", type=float, required=True)
    p.add_argument("--trial_idx", type=int, default=0)
    p.add_argument("--tracker_base", default="/tmp/torchx-util-booth")
    ns = p.parse_args(argv)
    value = booth_value(ns.x1, ns.x2)
    _put(ns.tracker_base, str(ns.trial_idx), json.dumps({"booth_eval": value}, indent=2).encode())
    print(f"booth({ns.x1:g}, {ns.x2:g}) = {value:g} (trial {ns.trial_idx})", flush=True)
    return 0


def _stop(proc: subprocess.Popen[bytes], kill_timeout: float) -> int:
    proc.terminate()
    print("issued terminate, waiting for exit...", flush=True)
    try:
        return proc.wait(kill_timeout)
    except subprocess.TimeoutExpired:
        print("reached the kill timeout, killing...", flush=True)
        proc.kill()
        return proc.wait()


def monitor(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="monitor", description="runs a program until a condition")
    p.add_argument("--timeout", type=float, default=0.0)
    p.add_argument("--start_on_file", default="")
    p.add_argument("--exit_on_file", default="")
    p.add_argument("--poll_rate", type=float, default=5.0)
    p.add_argument("--kill_timeout", type=float, default=60.0)
    p.add_argument("program", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    program = ns.program[1:] if ns.program[:1] == ["--"] else ns.program
    if not program:
        p.error("no program to run (give it after --)")
    start = time.monotonic()

    def timed_out() -> bool:
        return bool(ns.timeout) and time.monotonic() - start > ns.timeout

    while ns.start_on_file and not _exists(ns.start_on_file):
        if timed_out():
            print("reached the timeout before starting, terminating...", flush=True)
            return TIMEOUT_EXIT_CODE
        time.sleep(ns.poll_rate)
    proc = subprocess.Popen(program)
    print(f"started process {proc.pid}", flush=True)
    while True:
        try:
            code = proc.wait(ns.poll_rate)
            print(f"process exited with exit code {code}", flush=True)
            return code
        except subprocess.TimeoutExpired:
            if timed_out():
                print("reached the timeout, terminating...", flush=True)
                break
            if ns.exit_on_file and _exists(ns.exit_on_file):
                print(f"{ns.exit_on_file} exists, terminating...", flush=True)
                break
    code = _stop(proc, ns.kill_timeout)
    print(f"process exited with exit code {code}", flush=True)
    return code


def main(argv: list[str]) -> int:
    apps = {"booth": booth, "monitor": monitor}
    if not argv or argv[0] not in apps:
        print("usage: python3 -m xrun.components._apps booth|monitor ...", file=sys.stderr)
        return 2
    return apps[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
