"""The replica's side of ``xrun.submit``: ``python3 -m xrun.calls.worker FOLDER MAX_BYTES
REPLICA``.

Each rank (a worker of the runtime agent, with RANK, WORLD_SIZE, MASTER_ADDR and the rest of
torchrun's env) loads the call from FOLDER, calls it, and writes its outcome back there (see
:mod:`xrun.calls.files`): rank 0 always, every rank when the caller asked for all ranks' values,
and any rank whose call raised. A call that raised exits 1, so the job fails as any failed
script does (the agent's root cause, the scheduler's status) and ``max_retries`` runs it again.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import CodeType
from typing import Any

from xrun.calls.files import (
    ARGS_FILE,
    CALL_FILE,
    ERROR,
    OK,
    Attempt,
    TooLargeError,
    dump,
    load,
    outcome_file,
    start_attempt,
    write_place,
)
from xrun.contract import STOP_DIR_ENV, TRIAL_INDEX_ENV
from xrun.runtime.stop import FLAG as STOP_FLAG


def _cloudpickle_on_path() -> None:
    """An image without cloudpickle has the caller's copy in xrun/_deps/ (the docker
    scheduler's build context): appended, so an image's own comes first."""
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        deps = Path(__file__).resolve().parent.parent / "_deps"
        if deps.is_dir():
            sys.path.append(str(deps))


def _picklable_error(exc: BaseException) -> BaseException:
    """``exc`` itself when it pickles, else a RuntimeError that names it (an exception holding
    a lock or a socket would otherwise lose the traceback too)."""
    import cloudpickle

    try:
        cloudpickle.dumps(exc)
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__qualname__}: {exc} (the exception does not pickle)")


def _refile(code: CodeType, filename: str) -> CodeType:
    """``code`` (and the code nested in it) named after ``filename`` again: cloudpickle names
    code sent by value ``<dynamic-code>``, which a traceback cannot show a line of."""
    consts = tuple(_refile(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _with_filename(fn: object, filename: str | None) -> None:
    """Name ``fn``'s code (a function's, or a callable object's class's methods') after the
    file it came from, where it came by value."""
    if not filename:
        return
    target = fn.func if isinstance(fn, functools.partial) else fn
    holders = [target] if hasattr(target, "__code__") else list(vars(type(target)).values())
    for f in holders:
        code = getattr(f, "__code__", None)
        if isinstance(code, CodeType) and code.co_filename == "<dynamic-code>":
            f.__code__ = _refile(code, filename)


def _load_call(folder: Path, limit: int) -> tuple[Path, dict[str, Any]]:
    """(the folder this call's outcome goes to, the call). One call: FOLDER itself. One call
    of a ``map_array`` (a trial of a sweep, XRUN_TRIAL_INDEX=I): FOLDER/I, whose ``args.pkl``
    completes FOLDER's shared ``call.pkl`` (the function, pickled once), or whose own
    ``call.pkl`` (a checkpoint's) replaces both."""
    call = load(folder / CALL_FILE, limit, "the call")
    if not call.get("map"):
        return folder, call
    index = os.environ.get(TRIAL_INDEX_ENV, "")
    if not index.isdigit():
        raise RuntimeError(f"a map_array call needs {TRIAL_INDEX_ENV} (got {index!r})")
    own = folder / index
    if (own / CALL_FILE).exists():
        return own, load(own / CALL_FILE, limit, "the checkpointed call")
    args, kwargs = load(own / ARGS_FILE, limit, f"the arguments of call {index}")
    return own, {**call, "args": args, "kwargs": kwargs}


# How long a signalled worker waits for its agent's stop flag: Slurm signals the agent and the
# workers of a step at once, and the agent raises the flag at once; a signal to the worker alone
# raises none (a failure: the agent restarts it in place, up to max_retries).
_FLAG_WAIT_S = 3.0


def _on_preemption(call: dict[str, Any], out: Path, limit: int, rank: int) -> None:
    """Checkpointing for a callable with a ``checkpoint`` method (submitit's Checkpointable).

    A stop (a Slurm preemption or time limit, ``xrun cancel``: the agent's stop flag, see
    :mod:`xrun.runtime.stop`; or SIGTERM/SIGUSR2 to this worker) calls ``fn.checkpoint(*args,
    **kwargs)``, which returns what the next attempt calls: a ``(fn, args, kwargs)`` tuple, an
    object with ``function``/``args``/``kwargs`` (submitit's DelayedSubmission), or None (the
    same call again); rank 0 stores it in the call's folder. Then the worker ends: 0 when the
    agent stops the job (Slurm requeues it, up to max_retries), else 128 + the signal (a
    failure: the agent restarts the worker in place).
    """
    stop_dir = os.environ.get(STOP_DIR_ENV, "")
    flag = Path(stop_dir, STOP_FLAG) if stop_dir else None

    def handler(signum: int, frame: object) -> None:
        # Once only. A stop often arrives twice: Slurm's SIGTERM, then the flag that _watch
        # turns into another SIGTERM; Python would run this handler again inside the first
        # one's checkpoint or wait, and the user's checkpoint would count two stops. Ignored
        # from here on, a signal already pending is dropped too (Python looks the handler up
        # when it runs it).
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        fn = call["fn"]
        code = 128 + signum
        try:
            if rank == 0:
                new = fn.checkpoint(*call["args"], **call["kwargs"])
                if new is not None:
                    if isinstance(new, tuple):
                        fn2, args2, kwargs2 = new
                    else:
                        fn2, args2, kwargs2 = new.function, new.args, new.kwargs
                    saved = {**call, "fn": fn2, "args": tuple(args2), "kwargs": dict(kwargs2)}
                    dump(saved, out / CALL_FILE, limit, "the checkpointed call")
                    print(f"xrun.calls.worker: checkpointed on signal {signum}", file=sys.stderr)
            deadline = time.monotonic() + _FLAG_WAIT_S
            while flag is not None and time.monotonic() < deadline:
                if flag.exists():
                    code = 0  # a stop of the whole job: ended as asked
                    break
                time.sleep(0.05)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # not SystemExit: the call's own handlers must not run

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGUSR2, handler)
    if flag is not None:
        _watch(flag)


def _watch(flag: Path) -> None:
    """Tell the agent this worker stops by itself (it then raises its flag at a stop request
    instead of killing the worker, and Slurm requeues a preempted job), and turn the flag into
    SIGTERM here, where the handler above checkpoints. The agent's protocol:
    :mod:`xrun.runtime.stop` (``watch-<LOCAL_RANK>``, then the ``stop`` flag)."""
    import threading

    try:
        (flag.parent / f"watch-{os.environ.get('LOCAL_RANK', '0')}").touch()
    except OSError:
        return

    def poll() -> None:
        while not flag.exists():
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=poll, name="xrun-stop-watch", daemon=True).start()


def _unloadable(folder: Path, limit: int, rank: int, attempt: Attempt, e: Exception) -> int:
    """The call does not unpickle here: most often a function, class or argument pickled by
    reference whose module the job cannot import. Said as the call's outcome, not only as a
    traceback in a log."""
    tb = traceback.format_exc()
    sys.stderr.write(tb)
    msg = (
        f"the call could not be loaded in the job (rank {rank}): {type(e).__name__}: {e}; "
        "what is pickled by reference (installed packages' functions and classes) must be "
        "importable where the job runs: install it there, or define it in your script"
    )
    index = os.environ.get(TRIAL_INDEX_ENV, "")
    own = folder / index
    out = start_attempt(own if index.isdigit() and own.is_dir() else folder, attempt)
    dump((ERROR, RuntimeError(msg), tb, rank), outcome_file(out, rank), limit, "the exception")
    return 1


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit():
        print("usage: python3 -m xrun.calls.worker FOLDER MAX_BYTES REPLICA", file=sys.stderr)
        return 2
    folder, limit, replica = Path(argv[0]), int(argv[1]), argv[2]
    _cloudpickle_on_path()
    rank = int(os.environ.get("RANK", "0"))
    # Outcomes go into this attempt's own folder: the caller reads the latest attempt's only
    # (files.py says why), so no earlier attempt's can pass for this one's.
    attempt = Attempt.of_env(os.environ)
    try:
        out, call = _load_call(folder, limit)
    except Exception as e:
        return _unloadable(folder, limit, rank, attempt, e)
    # Which replica's log holds this rank's lines (Job.stdout): the rendezvous, not the
    # replica's index, orders the nodes.
    write_place(out, rank, replica, os.environ.get("LOCAL_RANK", "0"))
    mine = outcome_file(start_attempt(out, attempt), rank)
    mine.unlink(missing_ok=True)  # this rank started again within its attempt
    fn, args, kwargs, all_ranks = call["fn"], call["args"], call["kwargs"], call["all_ranks"]
    _with_filename(fn, call.get("filename"))
    if callable(getattr(fn, "checkpoint", None)):
        _on_preemption(call, out, limit, rank)
    try:
        value = fn(*args, **kwargs)
    except BaseException as e:  # SystemExit too: the caller asked for a value
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        dump((ERROR, _picklable_error(e), tb, rank), mine, limit, "the exception")
        return 1
    if rank == 0 or all_ranks:
        try:
            dump((OK, value), mine, limit, f"the result of rank {rank}")
        except Exception as e:  # too large (files.TooLargeError), or a value that won't pickle
            msg = f"xrun.calls.worker: the result of rank {rank} was not sent back: {e}"
            print(msg, file=sys.stderr)
            err = TooLargeError(msg) if isinstance(e, TooLargeError) else RuntimeError(msg)
            dump((ERROR, err, msg + "\n", rank), mine, limit, "the exception")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
