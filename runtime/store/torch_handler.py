"""torch's TCPStore protocol, server side, without I/O: what each request does to the workers'
key space and what it answers.

* :class:`TorchService`: one per workers' key space (``torch_data.WorkersKeySpace``, one per
  workers' generation), with the barriers parked on it;
* :class:`TorchHandler`: one connection's requests: ``service.handler(send)``; ``feed(data)``
  parses (``torch_protocol``), applies and hands every answer to ``send`` in order. A WAIT (or
  BARRIER) whose keys are not there yet is parked and answered later, from inside whichever call
  (on any connection) makes them appear, through the same ``send``.

``handler.XrunHandler`` is the same shape for xrun's protocol; ``session.Session`` (the one
connection class, which ``server.py`` gives a connection whose first bytes are torch's
handshake) drives either.

torch's protocol has no error answer: its servers drop a connection that sends something they
cannot serve, and so does this one (``ProtocolError``), logging why at debug level.

Semantics follow torch 2.13's libuv server (its default), except where noted in
docs/torch-tcpstore-protocol.md: a parked WAIT is answered when all its keys are present, which
torch approximates by counting writes.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Final, Protocol

from .session import Handler
from .torch_protocol import (
    DEFAULT_LIMITS,
    STOP_WAITING,
    WAIT_CANCELED,
    Add,
    Append,
    Barrier,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    Limits,
    ListKeys,
    MultiGet,
    MultiSet,
    Ping,
    ProtocolError,
    QueueLen,
    QueuePop,
    QueuePush,
    Request,
    RequestParser,
    Set,
    Validate,
    Wait,
    encode_bytes,
    encode_check,
    encode_int,
    encode_list_keys,
    encode_multi_get,
    encode_nonce,
    encode_queue_pop,
)

__all__ = ["KeySpace", "TorchHandler", "TorchService"]

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class KeySpace(Protocol):
    """The data torch-protocol connections share: keys with byte values, FIFO queues, and
    parked waits. Calls come from one thread (the event loop); none may block.

    Present: a key is present when it has a value or a non-empty queue of that name.
    Waits: ``park(keys, wake)`` returns None when all ``keys`` are present now; otherwise it
    parks the wait and returns a ticket. ``wake()`` is then called once, from inside the call
    that made the last of them present (``set``/``add``/``append``/``queue_push``), after the
    wait was removed; ``unpark(ticket)`` forgets a wait and is a no-op once it fired. A
    ``queue_push`` wakes at most one wait parked on the queue's name (the one whose pop will
    take the item); a write to a key wakes every wait it completes.
    """

    def get(self, key: str) -> bytes | None: ...
    def set(self, key: str, value: bytes) -> None: ...
    def add(self, key: str, delta: int) -> int:
        """Add to the integer stored as ASCII decimal (a missing key counts as 0), store and
        return the sum; ValueError if the value is not an integer."""
        ...

    def append(self, key: str, value: bytes) -> None:
        """Append to the value (a missing key is created with ``value``)."""
        ...

    def delete(self, key: str) -> bool: ...
    def num_keys(self) -> int:
        """How many keys have a value (queues do not count, as in torch)."""
        ...

    def keys(self) -> list[str]: ...
    def present(self, keys: Sequence[str]) -> bool: ...
    def park(self, keys: Sequence[str], wake: Callable[[], None]) -> Hashable | None: ...
    def unpark(self, ticket: Hashable) -> None: ...
    def queue_push(self, key: str, value: bytes) -> None: ...
    def queue_pop(self, key: str) -> bytes | None: ...
    def queue_len(self, key: str) -> int: ...


class TorchService:
    """Everything the sessions of one key space share: the key space and parked barriers."""

    def __init__(self, space: KeySpace, limits: Limits = DEFAULT_LIMITS) -> None:
        self.space = space
        self.limits = limits
        # barrier key -> the handlers parked on it, in arrival order
        self._barriers: dict[str, dict[TorchHandler, None]] = {}

    def handler(self, send: Callable[[bytes], None]) -> TorchHandler:
        """A new connection's handler; ``send`` takes every byte it answers, in order."""
        return TorchHandler(self, send)

    def _arrive(self, session: TorchHandler, key: str, world_size: int) -> bool:
        """Count one arrival at barrier ``key``; True releases the caller (and everyone parked
        there), False parks it. The count lives in the key as ADD would keep it, as in torch."""
        count = _add(self.space, key, 1)
        if count >= world_size:
            for waiter in self._barriers.pop(key, {}):
                waiter._barrier_released()
            return True
        self._barriers.setdefault(key, {})[session] = None
        return False

    def _leave(self, session: TorchHandler, key: str) -> None:
        waiters = self._barriers.get(key)
        if waiters is not None:
            waiters.pop(session, None)
            if not waiters:
                del self._barriers[key]


def _add(space: KeySpace, key: str, delta: int) -> int:
    try:
        total = space.add(key, delta)
    except ValueError as e:
        raise ProtocolError(f"ADD to {key!r}, whose value is not an integer: {e}") from None
    if not _I64_MIN <= total <= _I64_MAX:
        raise ProtocolError(f"ADD to {key!r} overflows a 64-bit integer ({total})")
    return total


_NOTHING: Final = b""


class TorchHandler(Handler):
    """One torch-protocol connection: parse, apply, answer (see the module docstring)."""

    def __init__(self, service: TorchService, send: Callable[[bytes], None]) -> None:
        super().__init__(RequestParser(service.limits), send)
        self._service = service
        self._space = service.space
        # The one wait this connection may have parked (torch's client awaits each answer):
        # a key-space ticket, or the key of a barrier.
        self._ticket: Hashable | None = None
        self._barrier: str | None = None
        self._closed = False
        self._handlers: dict[type, Callable[..., bytes]] = {
            Validate: lambda _r: _NOTHING,
            Ping: lambda r: encode_nonce(r.nonce),
            Set: self._set,
            CompareSet: self._compare_set,
            Get: lambda r: encode_bytes(self._space.get(r.key) or b""),
            Add: lambda r: encode_int(_add(self._space, r.key, r.delta)),
            Check: lambda r: encode_check(self._space.present(r.keys)),
            Wait: self._wait,
            GetNumKeys: lambda _r: encode_int(self._space.num_keys()),
            DeleteKey: lambda r: encode_int(int(self._space.delete(r.key))),
            Append: self._append,
            MultiGet: lambda r: encode_multi_get([self._space.get(k) or b"" for k in r.keys]),
            MultiSet: self._multi_set,
            CancelWait: self._cancel_wait,
            QueuePush: self._queue_push,
            QueuePop: lambda r: encode_queue_pop(self._space.queue_pop(r.key)),
            QueueLen: lambda r: encode_int(self._space.queue_len(r.key)),
            ListKeys: lambda _r: encode_list_keys(self._space.keys()),
            Barrier: self._barrier_arrive,
        }

    @property
    def waiting(self) -> bool:
        """Whether a WAIT or BARRIER of this connection is parked."""
        return self._ticket is not None or self._barrier is not None

    def handle(self, request: Request) -> bytes:
        """Apply one request; returns its immediate answer (b"" when it has none yet)."""
        if self._closed:
            raise ProtocolError("this connection's session is closed")
        return self._handlers[type(request)](request)

    def close(self) -> None:
        """The connection is gone: forget its parked wait. Idempotent."""
        self._closed = True
        self._forget_wait()

    # --- writes (they may wake other connections' waits) ---

    def _set(self, r: Set) -> bytes:
        self._space.set(r.key, r.value)
        return _NOTHING

    def _append(self, r: Append) -> bytes:
        self._space.append(r.key, r.value)
        return _NOTHING

    def _multi_set(self, r: MultiSet) -> bytes:
        for key, value in zip(r.keys, r.values, strict=True):
            self._space.set(key, value)
        return _NOTHING

    def _queue_push(self, r: QueuePush) -> bytes:
        self._space.queue_push(r.key, r.value)
        return _NOTHING

    def _compare_set(self, r: CompareSet) -> bytes:
        """torch's rule: a missing key is created only when ``expected`` is empty (answer: the
        new value) and is otherwise left missing (answer: ``expected``, as torch does); a
        present key takes ``desired`` when it equals ``expected``. The answer is the value now."""
        current = self._space.get(r.key)
        if current is None:
            if r.expected:
                return encode_bytes(r.expected)
            self._space.set(r.key, r.desired)
            return encode_bytes(r.desired)
        if current == r.expected:
            self._space.set(r.key, r.desired)
            return encode_bytes(r.desired)
        return encode_bytes(current)

    # --- waits ---

    def _wait(self, r: Wait) -> bytes:
        self._check_no_wait("WAIT")
        ticket = self._space.park(r.keys, self._woken)
        if ticket is None:
            return STOP_WAITING
        self._ticket = ticket
        return _NOTHING

    def _barrier_arrive(self, r: Barrier) -> bytes:
        self._check_no_wait("BARRIER")
        if self._service._arrive(self, r.key, r.world_size):
            return STOP_WAITING
        self._barrier = r.key
        return _NOTHING

    def _cancel_wait(self, _r: CancelWait) -> bytes:
        """The client's wait timed out. If the answer already left, the client reads it and
        then this one (torch's client expects exactly that order)."""
        self._forget_wait()
        return WAIT_CANCELED

    def _check_no_wait(self, what: str) -> None:
        if self.waiting:
            raise ProtocolError(
                f"{what} while another wait is parked on this connection "
                "(torch's client awaits each answer before its next request)"
            )

    def _forget_wait(self) -> None:
        if self._ticket is not None:
            self._space.unpark(self._ticket)
            self._ticket = None
        if self._barrier is not None:
            self._service._leave(self, self._barrier)
            self._barrier = None

    def _woken(self) -> None:
        self._ticket = None
        self._emit(STOP_WAITING)

    def _barrier_released(self) -> None:
        self._barrier = None
        self._emit(STOP_WAITING)

    def _emit(self, answer: bytes) -> None:
        """A late answer (a parked wait released)."""
        if not self._closed:
            self._send(answer)
