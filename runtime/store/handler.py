"""xrun's protocol, server side, without I/O: what one client's requests do and what they answer.

``XrunHandler(data, admission, send)`` is one connection's handler: ``feed(data)`` parses the
client's bytes (``protocol.RequestParser``), answers the handshake, applies each request to the
shared ``KeySpace`` (``data.py``) and hands every answer to ``send`` in order. A WAIT whose keys
are not there yet is parked and answered later, from inside whichever call (on any connection)
makes them appear, through the same ``send``. ``torch_handler.TorchHandler`` is the same shape
for torch's protocol; ``session.Session`` (the one connection class) drives either.

What the connection must do about the client is raised: ``ProtocolError`` (drop it: bytes that
do not parse, a frame over the limit) and ``Refused`` (a wrong or missing token: the verdict went
to ``send``; half-close, ignore the rest).

Limits that keep one bad client from hurting the others: the frame limits (``RequestParser``),
at most ``MAX_WAITS_PER_CONNECTION`` parked waits per connection (more is an ERROR answer).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from .data import KeySpace, Waiter
from .errors import ProtocolError, Refused, StoreError
from .protocol import (
    DEFAULT_MAX_FRAME,
    I64,
    NONCE_LEN,
    Add,
    Credentials,
    Delete,
    Hello,
    Lease,
    Message,
    Ping,
    RequestParser,
    Set,
    Status,
    Wait,
    auth_mac,
    encode_response,
    encode_values,
    encode_verdict,
    greeting,
    pack_bytes,
)
from .session import Handler

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "MAX_WAITS_PER_CONNECTION", "Admission", "XrunHandler"]

DEFAULT_HANDSHAKE_TIMEOUT = 10.0
# A misbehaving client must not pin unbounded server memory with parked waits.
MAX_WAITS_PER_CONNECTION = 256
_REFUSAL = "wrong or missing token for this rendezvous store"


class Admission(NamedTuple):
    """Who may talk to the store and how much they may send: the same for every connection.

    A NamedTuple: cheaper to create at import than a dataclass, on every agent's start-up path.
    """

    token: bytes | None = None  # the job's secret; None: no authentication
    max_frame: int = DEFAULT_MAX_FRAME
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT  # the connection's (session.py)


class XrunHandler(Handler):
    """One xrun-protocol connection: parse, apply, answer (see the module docstring)."""

    def __init__(self, data: KeySpace, admission: Admission, send: Callable[[bytes], None]) -> None:
        super().__init__(RequestParser(admission.max_frame), send)
        self.data = data
        self.token = admission.token
        self.nonce = b""
        self.trusted = False  # the client proved the token (or none is needed)
        self.waits: set[Waiter] = set()
        self.owned_leases: set[str] = set()
        self._closed = False

    def handle(self, message: Message) -> bytes:
        """Apply one message; its immediate answer (b"" when it has none, or none yet)."""
        if self._closed:
            raise ProtocolError("this connection's handler is closed")
        if not self.trusted and not isinstance(message, (Hello, Credentials)):
            raise ProtocolError("a request before the handshake")  # the parser prevents it
        try:
            return _HANDLERS[type(message)](self, message)
        except StoreError as e:
            if isinstance(e, ProtocolError):
                raise
            rid = getattr(message, "rid", 0)
            return encode_response(rid, Status.ERROR, pack_bytes(str(e).encode())) if rid else b""

    def close(self) -> None:
        """The connection is gone: forget its parked waits, fire the leases it owns.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        for w in list(self.waits):
            self.data.unpark(w)
        self.waits.clear()
        self.data.drop_owner(self, self.owned_leases)

    # -- the handshake --------------------------------------------------------------------------

    def _hello(self, _m: Hello) -> bytes:
        # The nonce only matters when a token is checked (and urandom is a system call).
        self.nonce = os.urandom(NONCE_LEN) if self.token else bytes(NONCE_LEN)
        return greeting(bool(self.token), self.nonce)

    def _credentials(self, m: Credentials) -> bytes:
        token = self.token
        if token is not None and not hmac.compare_digest(m.mac, auth_mac(token, self.nonce)):
            self._send(encode_verdict(_REFUSAL))
            raise Refused(_REFUSAL)
        self.trusted = True
        return encode_verdict(None)

    # -- requests -------------------------------------------------------------------------------

    @staticmethod
    def _ok(rid: int, payload: bytes = b"") -> bytes:
        return encode_response(rid, Status.OK, payload) if rid else b""

    def _set(self, r: Set) -> bytes:
        self.data.put(r.key, r.value)
        return self._ok(r.rid)

    def _add(self, r: Add) -> bytes:
        return self._ok(r.rid, I64.pack(self.data.add(r.key, r.delta)))

    def _delete(self, r: Delete) -> bytes:
        self.data.delete(r.key)
        return self._ok(r.rid)

    def _lease(self, r: Lease) -> bytes:
        self.data.lease(r.key, r.ttl, r.fire_key, r.fire_value, self if r.owned else None)
        if r.owned:
            self.owned_leases.add(r.key)
        return self._ok(r.rid)

    def _wait(self, r: Wait) -> bytes:
        """Answer now (the keys are there, or timeout 0) or park until they are; too many
        parked waits is a StoreError, answered as an error."""
        data, keys, want_all = self.data, r.keys, r.want_all
        if r.timeout == 0 or data.ready(keys, want_all):
            return self._values(r.rid, data.ready(keys, want_all), keys)
        if len(self.waits) >= MAX_WAITS_PER_CONNECTION:
            raise StoreError(f"more than {MAX_WAITS_PER_CONNECTION} waits on one connection")

        def done(w: Waiter, ok: bool) -> None:
            self.waits.discard(w)
            answer = self._values(r.rid, ok, keys)
            if answer and not self._closed:
                self._send(answer)

        w = Waiter(keys, want_all, done)
        self.waits.add(w)
        data.park(w, r.timeout)
        return b""

    def _values(self, rid: int, ok: bool, keys: tuple[str, ...]) -> bytes:
        if not rid:
            return b""
        status = Status.OK if ok else Status.TIMEOUT
        return encode_response(rid, status, encode_values(self.data.get_many(keys)))


# Message type -> what handles it: one table for the class, not a dict of bound methods built
# per connection (16,384 agents are 16,384 connections, benchmark 11).
_HANDLERS: dict[type, Callable[[XrunHandler, Any], bytes]] = {
    Hello: XrunHandler._hello,
    Credentials: XrunHandler._credentials,
    Set: XrunHandler._set,
    Add: XrunHandler._add,
    Wait: XrunHandler._wait,
    Delete: XrunHandler._delete,
    Lease: XrunHandler._lease,
    Ping: lambda h, r: h._ok(r.rid),
}
