"""A training loop's side of a graceful stop (preemption, time limit, ``xrun cancel``, ``docker
stop``, SIGTERM to a supervisor): every rank stops after the same step, outside any signal
handler::

    from xrun.runtime import stop

    for step in range(start, total):
        train_one_step(step)
        if stop.requested(step):      # cheap: one stat() per call until a stop is requested
            save_checkpoint(step)     # every rank gets True after the same step
            sys.exit(0)

How it works. The runtime agent that gets the stop signal does not pass it on to workers that
call ``requested`` (it tells the other nodes' agents through the rendezvous store); each agent
creates the flag file ``$XRUN_STOP_DIR/stop``. A rank that sees the flag adds 1 to an ack counter
in the workers' store (``MASTER_ADDR:MASTER_PORT``, the agent's) and carries on. Rank 0, once all
``WORLD_SIZE`` acks are in, sets the stop step to its current step + 2; every rank that has seen
the flag reads that key at each later call and returns True from that step on. Nobody ever
waits for anybody: DDP ranks run within one step of each other (each step's all_reduce needs
them all), so when rank 0 sets the key at step s every rank is at most one step behind or
ahead and reads it by step s + 1; + 2 also keeps the store alive until every rank has read it
(the store's node leaves only after its own ranks stopped). Ranks that do not run in lockstep
still stop, each at ``max(stop step, its step)``.

A SIGTERM, SIGUSR1 or SIGUSR2 sent to the worker itself counts as the flag (at a preemption
Slurm signals every process of the job step, and srun passes the ``--signal`` warning of a time
limit on to every process too, whose default action would end the worker at once): from the
first call of ``requested`` on, a handler that only notes the request is installed for each of
them that the program has not handled itself.

Outside an xrun agent (no ``XRUN_STOP_DIR``) ``requested`` is always False. Only the standard
library is imported here; torch's ``TCPStore`` is imported once a stop has been requested.
"""

from __future__ import annotations

import os

from xrun.contract import STOP_DIR_ENV

__all__ = ["STOP_DIR_ENV", "requested", "stop_step"]

FLAG = "stop"  # the file the agent creates in that dir at a stop request
_ACKS = "xrun/stop/acks"
_STEP = "xrun/stop/step"


class _State:
    __slots__ = ("acked", "flag", "rank", "seen", "stop", "store", "world")

    def __init__(self, path: str) -> None:
        self.flag = os.path.join(path, FLAG) if path else ""
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.seen = False  # the flag was seen
        self.acked = False
        self.stop: int | None = None  # the agreed step
        self.store: object | None = None
        if path:
            # Tell the agent that this rank watches for stop requests, so that it does not
            # forward the signal to it (once per process; the agent's dir is per attempt).
            lr = os.environ.get("LOCAL_RANK", "0")
            try:
                os.close(os.open(os.path.join(path, f"watch-{lr}"), os.O_CREAT | os.O_WRONLY))
            except OSError:
                pass
            _note_signals(self)


def _note_signals(st: _State) -> None:
    """A stop signal sent to the worker itself (Slurm signals every process of a step at a
    preemption, and srun passes a time limit's ``--signal`` warning to every process, not only
    the agent) is a stop request too: the handler only notes it, the loop saves at the agreed
    step. A handler the program installed itself (or SIG_IGN) is left alone."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def note(signum: int, frame: object) -> None:
        st.seen = True

    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, note)


_state: _State | None = None


def _get() -> _State:
    global _state
    if _state is None:
        _state = _State(os.environ.get(STOP_DIR_ENV, ""))
    return _state


def requested(step: int) -> bool:
    """True once every rank is to stop: call it after each step with the step's number
    (increasing); all ranks get True after the same step. Never blocks on other ranks."""
    st = _get()
    if st.stop is not None:
        return step >= st.stop
    if not st.flag:
        return False
    if not st.seen:
        if not os.path.exists(st.flag):
            return False
        st.seen = True
    if st.world <= 1:
        st.stop = step
        return True
    try:
        return _agree(st, step)
    except Exception:  # noqa: BLE001 - the store is gone: the job is ending, stop now
        st.stop = step
        return True


def stop_step() -> int | None:
    """The agreed step (None until it is known to this rank)."""
    return _get().stop


def _agree(st: _State, step: int) -> bool:
    store = st.store
    if store is None:
        from datetime import timedelta

        from torch.distributed import TCPStore

        store = st.store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=30),
        )
    if not st.acked:
        store.add(_ACKS, 1)  # type: ignore[attr-defined]
        st.acked = True
    if store.check([_STEP]):  # type: ignore[attr-defined]
        st.stop = int(store.get(_STEP))  # type: ignore[attr-defined]
        return step >= st.stop
    if st.rank == 0 and store.add(_ACKS, 0) >= st.world:  # type: ignore[attr-defined]
        st.stop = step + 2
        store.set(_STEP, str(st.stop))  # type: ignore[attr-defined]
    return st.stop is not None and step >= st.stop
