"""One client connection speaking xrun's protocol, server side: handshake, frames in, answers out.

``StoreServer`` makes one ``XrunSession`` per connection that opens with xrun's ``HELLO``
(``server.py`` is where a connection's protocol is chosen); the session greets the client with
its challenge, authenticates it, decodes its requests
(``protocol.py``), applies them to the shared ``KeySpace`` (``data.py``) and encodes the
answers. It is a ``loop.StreamProtocol`` (asyncio's Protocol callbacks) rather than a stream: a
connection costs no task, every complete frame of one read is handled in one go, and the
answers to one read leave in one send. That matters when 1024 agents hit one store, and more
when they are threads of one process fighting over the GIL (the benchmark): every send/recv is
a GIL hand-off.

Limits that keep one bad client from hurting the others: frames over ``max_frame`` and bytes that
do not parse close that connection; before it authenticates a client may send no frame over
256 bytes, and one that does not authenticate within ``handshake_timeout`` is dropped; at most
256 parked waits per connection; a client that leaves more than 64 MiB of answers unread is
dropped.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import socket
from typing import TYPE_CHECKING, Any, NamedTuple

from ..lazylog import LazyLogger
from .data import Clock, KeySpace, Timer, Waiter
from .errors import ProtocolError, StoreError
from .protocol import (
    DEFAULT_MAX_FRAME,
    I64,
    LEN,
    MAGIC,
    MAX_HANDSHAKE_FRAME,
    NONCE_LEN,
    Op,
    Reader,
    Status,
    auth_mac,
    encode_response,
    encode_values,
    greeting,
    pack_bytes,
)

if TYPE_CHECKING:
    from .loop import Transport

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "MAX_WAITS_PER_CONNECTION", "Admission", "XrunSession"]

log = LazyLogger(__name__)

DEFAULT_HANDSHAKE_TIMEOUT = 10.0
# A misbehaving client must not pin unbounded server memory with parked waits.
MAX_WAITS_PER_CONNECTION = 256


class Admission(NamedTuple):
    """Who may talk to the store and how much they may send: the same for every session.

    A NamedTuple: cheaper to create at import than a dataclass, on every agent's start-up path.
    """

    token: bytes | None = None  # the job's secret; None: no authentication
    max_frame: int = DEFAULT_MAX_FRAME
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT


class XrunSession:
    """One client connection, a ``loop.StreamProtocol``: handshake, then frames in, answers
    out. ``sessions`` is the server's set of live sessions (this one joins it while connected)."""

    # Answers a client does not read pile up in the transport; past this, drop the client.
    MAX_UNSENT = 64 << 20

    def __init__(
        self, data: KeySpace, clock: Clock, sessions: set[Any], admission: Admission
    ) -> None:
        self.data = data
        self.clock = clock
        self.sessions = sessions
        self.admission = admission
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.transport: Transport | None = None
        self.nonce = b""
        self.authed = False
        self.rejected = False
        self.waits: set[Waiter] = set()
        self.owned_leases: set[str] = set()
        self.hs_timer: Timer | None = None

    # -- loop callbacks -------------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:
        self.transport = transport
        self.sessions.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        token = self.admission.token
        # The nonce only matters when a token is checked (and urandom is a system call).
        self.nonce = os.urandom(NONCE_LEN) if token else bytes(NONCE_LEN)
        transport.write(greeting(bool(token), self.nonce))
        self.hs_timer = self.clock.call_later(
            self.admission.handshake_timeout, self._handshake_expired
        )

    def data_received(self, data: bytes) -> None:
        if self.rejected:
            return  # swallow what a refused client pipelined (see _refuse)
        buf = self.buf
        buf += data
        max_frame = self.admission.max_frame
        try:
            pos = 0
            while len(buf) - pos >= 4:
                (n,) = LEN.unpack_from(buf, pos)
                if not self.authed and n > MAX_HANDSHAKE_FRAME:
                    # Before it proves the token, a client gets no room to make us buffer much.
                    raise ProtocolError(f"handshake frame of {n} bytes")
                if n > max_frame:
                    raise ProtocolError(f"frame of {n} bytes exceeds the {max_frame}-byte limit")
                if len(buf) - pos - 4 < n:
                    break
                frame = bytes(buf[pos + 4 : pos + 4 + n])
                pos += 4 + n
                if self.authed:
                    self._dispatch(frame)
                else:
                    self._handshake(frame)
                    if self.rejected or self.transport is None:
                        return
            del buf[:pos]
        except ProtocolError as e:
            log.debug("store: dropping a client: %s", e)
            self.close()
            return
        except Exception:  # a bug must cost one connection, never the server
            log.exception("store: unexpected error on a connection")
            self.close()
            return
        self.flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        pass  # flush() drops a client whose unread answers pile up past MAX_UNSENT

    def resume_writing(self) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.sessions.discard(self)
        if self.hs_timer is not None:
            self.hs_timer.cancel()
        for w in list(self.waits):
            self.data.unpark(w)
        self.waits.clear()
        self.transport = None
        self.data.drop_owner(self, self.owned_leases)

    # -- helpers ------------------------------------------------------------------------------

    def reply(self, rid: int, status: Status, payload: bytes = b"") -> None:
        if rid != 0:
            self.out.append(encode_response(rid, status, payload))

    def flush(self) -> None:
        t = self.transport
        if self.out and t is not None and not t.is_closing():
            t.write(b"".join(self.out) if len(self.out) > 1 else self.out[0])
            if t.get_write_buffer_size() > self.MAX_UNSENT:
                log.warning("store: dropping a client that does not read its answers")
                self.close()
        self.out.clear()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def shutdown(self) -> None:
        """The server stops: send what was answered, then close."""
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def _handshake_expired(self) -> None:
        if not self.authed:
            log.info(
                "store: dropped a client that sent no handshake in %ss",
                self.admission.handshake_timeout,
            )
            self.close()

    def _handshake(self, body: bytes) -> None:
        if not body.startswith(MAGIC):
            raise ProtocolError("bad handshake")
        token = self.admission.token
        mac = body[len(MAGIC) :]
        if token is not None and not hmac.compare_digest(mac, auth_mac(token, self.nonce)):
            self._refuse()
            return
        if self.hs_timer is not None:
            self.hs_timer.cancel()
        self.authed = True
        self.out.append(pack_bytes(b"\x00"))

    def _refuse(self) -> None:
        # Half-close and ignore what the client already pipelined: closing with unread input
        # would send an RST that can destroy the verdict before the client reads it. The
        # handshake timer still closes the connection for good.
        assert self.transport is not None
        self.rejected = True
        self.transport.write(pack_bytes(b"\x01wrong or missing token for this rendezvous store"))
        if self.transport.can_write_eof():
            self.transport.write_eof()

    # -- requests -------------------------------------------------------------------------------

    def _dispatch(self, body: bytes) -> None:
        r = Reader(body)
        rid = r.u32()
        op = r.u8()
        data = self.data
        try:
            if op == Op.WAIT:
                self._wait(rid, r)
                return
            payload = b""
            if op == Op.SET:
                key = r.str_()
                data.put(key, r.bytes_())
            elif op == Op.ADD:
                key = r.str_()
                payload = I64.pack(data.add(key, r.i64()))
            elif op == Op.DELETE:
                data.delete(r.str_())
            elif op == Op.LEASE:
                key = r.str_()
                ttl = r.f64()
                fire_key = r.str_()
                fire_value = r.bytes_()
                owned = bool(r.u8() & 1)
                data.lease(key, ttl, fire_key, fire_value, self if owned else None)
                if owned:
                    self.owned_leases.add(key)
            elif op != Op.PING:
                raise ProtocolError(f"unknown op {op}")
        except ProtocolError:
            raise
        except StoreError as e:
            self.reply(rid, Status.ERROR, pack_bytes(str(e).encode()))
        else:
            self.reply(rid, Status.OK, payload)

    def _wait(self, rid: int, r: Reader) -> None:
        """WAIT: answer now (the keys are there, or timeout 0) or park until they are; a
        StoreError (too many parked waits) is answered as an error by ``_dispatch``."""
        data = self.data
        want_all = r.u8() == 0
        timeout = r.f64()
        keys = tuple(r.str_() for _ in range(r.u32()))
        if timeout == 0 or data.ready(keys, want_all):
            ok = data.ready(keys, want_all)
            self.reply(rid, Status.OK if ok else Status.TIMEOUT, encode_values(data.get_many(keys)))
            return
        if len(self.waits) >= MAX_WAITS_PER_CONNECTION:
            raise StoreError(f"more than {MAX_WAITS_PER_CONNECTION} waits on one connection")

        def done(w: Waiter, ok: bool) -> None:
            self.waits.discard(w)
            self.reply(rid, Status.OK if ok else Status.TIMEOUT, encode_values(data.get_many(keys)))
            self.flush()

        w = Waiter(keys, want_all, done)
        self.waits.add(w)
        data.park(w, timeout)
