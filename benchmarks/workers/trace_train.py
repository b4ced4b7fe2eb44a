"""examples/train_ddp.py with timestamps (benchmarks/recovery_trace.py): every phase of a
(re)started worker's way to its first step, as ``time.monotonic()`` lines (CLOCK_MONOTONIC is
the same clock in every process of the machine) appended to ``$XRUN_TRACE_DIR/trace``."""

from __future__ import annotations

import os
import sys
import time

_T0 = time.monotonic()
_DIR = os.environ["XRUN_TRACE_DIR"]
_TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_ddp.py")


def mark(event: str, at: float | None = None) -> None:
    who = f"{os.getpid()} r{os.environ.get('RANK')} a{os.environ.get('TORCHELASTIC_RESTART_COUNT')}"
    with open(os.path.join(_DIR, "trace"), "a") as f:
        f.write(f"{at or time.monotonic():.6f} {who} {event}\n")


def main() -> None:
    mark(f"script-start mods={len(sys.modules)}", _T0)
    import importlib.util

    n = len(sys.modules)
    # Loaded by path under its own name: never a module the pool's reports name.
    spec = importlib.util.spec_from_file_location("train_ddp_traced", os.path.abspath(_TRAIN))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mark(f"imported +{len(sys.modules) - n} mods")

    dist = mod.dist
    real_init, real_resume, real_ddp = (
        dist.init_process_group,
        mod.resume,
        mod.DistributedDataParallel,
    )
    real_commit = mod.Snapshotter.commit
    first = [True]

    def init(*a, **k):  # noqa: ANN002, ANN003
        mark("init_process_group begin")
        r = real_init(*a, **k)
        mark("init_process_group end")
        return r

    def resume(*a, **k):  # noqa: ANN002, ANN003
        mark("restore begin")
        r = real_resume(*a, **k)
        mark(f"restore end step={r}")
        return r

    def ddp(*a, **k):  # noqa: ANN002, ANN003
        n = len(sys.modules)
        mark("ddp begin")
        r = real_ddp(*a, **k)
        mark(f"ddp end +{len(sys.modules) - n} mods")
        return r

    def commit(self, step, **k):  # noqa: ANN001, ANN003
        if first[0]:
            mark(f"first step trained (commit {step}) mods={len(sys.modules)}")
        r = real_commit(self, step, **k)
        if first[0]:
            first[0] = False
            mark("first commit end")
        return r

    dist.init_process_group, mod.resume, mod.DistributedDataParallel = init, resume, ddp
    mod.Snapshotter.commit = commit
    sys.stdout.flush()
    code = mod.main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
