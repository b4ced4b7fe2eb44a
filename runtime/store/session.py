"""One client connection of the store, server side, whatever protocol it speaks: ``Session``.

``StoreServer`` makes one ``Session`` per accepted connection. Its first bytes choose the
protocol (``server.StoreServer._choose``: xrun's ``HELLO`` or torch's VALIDATE), which gives the
session a ``Handler`` without I/O (``handler.XrunHandler``, ``torch_handler.TorchHandler``);
from then on bytes in go to the handler and its answers go out. Everything a connection does
with its socket is here, once for both protocols: TCP_NODELAY, batching, the handshake deadline,
dropping a bad or greedy client, half-closing after a refusal, shutting down.

A ``loop.StreamProtocol`` (asyncio's Protocol callbacks) rather than a stream: a connection
costs no task, every request completed by one read is handled in one go, and the answers to one
read leave in one send. That matters when 1024 agents hit one store, and more when they are
threads of one process fighting over the GIL (benchmark 11): every send/recv is a GIL hand-off.

Limits that keep one bad client from hurting the others: bytes that do not parse close that
connection (the handler raises ProtocolError); a client that has not chosen a protocol and
finished its handshake within ``handshake_timeout`` is dropped; one that leaves more than
``MAX_UNSENT`` bytes of answers unread is dropped.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..lazylog import LazyLogger
from .errors import ProtocolError, Refused

if TYPE_CHECKING:
    from .data import Clock, Timer
    from .loop import Transport

__all__ = ["Handler", "Session"]

log = LazyLogger(__name__)


class Parser(Protocol):
    """A protocol's incremental request parser (``protocol.RequestParser``,
    ``torch_protocol.RequestParser``): bytes in, then the values they complete."""

    def feed(self, data: bytes) -> None: ...
    def __iter__(self) -> Iterator[Any]: ...


class Handler:
    """One connection's protocol without I/O, what a ``Session`` drives: ``feed(data)`` parses
    and applies, every answer goes to ``send`` (also the late ones: a parked wait answered from
    another connection's call). ``handle(request)`` returns one request's immediate answer
    (b"": none, or not yet); ``close()`` forgets the connection's waits. ``feed`` raises
    ProtocolError when the connection must be dropped, ``Refused`` when it must half-close."""

    # Past the handshake: the session's handshake deadline stops. A protocol with credentials
    # starts untrusted.
    trusted: bool = True

    def __init__(self, parser: Parser, send: Callable[[bytes], None]) -> None:
        self._parser = parser
        self._send = send

    def feed(self, data: bytes) -> None:
        self._parser.feed(data)
        for request in self._parser:
            answer = self.handle(request)
            if answer:
                self._send(answer)

    def handle(self, request: Any) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


# (first bytes, send) -> the connection's handler; None: too few bytes to tell yet; ValueError:
# bytes of no protocol the store speaks.
Chooser = Callable[[bytes, Callable[[bytes], None]], "Handler | None"]


class Session:
    """One connection on the store's event loop (a ``loop.StreamProtocol``); ``sessions`` is
    the server's set of live sessions (this one joins it while connected)."""

    # Answers a client does not read pile up in the transport; past this, drop the client.
    MAX_UNSENT = 64 << 20

    def __init__(
        self,
        choose: Chooser,
        clock: Clock,
        sessions: set[Any],
        handshake_timeout: float,
        admit: Callable[[Session], bool] | None = None,
    ) -> None:
        self.choose = choose
        self.admit = admit  # once the protocol is chosen: may this client speak it?
        self.clock = clock
        self.sessions = sessions
        self.handshake_timeout = handshake_timeout
        self.handler: Handler | None = None
        self.transport: Transport | None = None
        self._first = b""  # bytes that came before the protocol was chosen
        self._out: list[bytes] | None = None  # answers of the data_received under way
        self._refused = False
        self._timer: Timer | None = None

    # -- loop callbacks -------------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:
        self.transport = transport
        self.sessions.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timer = self.clock.call_later(self.handshake_timeout, self._handshake_expired)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # swallow what a refused client pipelined (see _fail)
        handler = self.handler or self._choose(data)
        if handler is None:
            return
        if self._first:
            data, self._first = self._first, b""
        out: list[bytes] = []
        self._out = out
        error: Exception | None = None
        try:
            handler.feed(data)
        except ProtocolError as e:
            error = e
        except Exception as e:  # a bug must cost one connection, never the server
            log.exception("store: unexpected error on a connection")
            error = e
        self._out = None
        # Answered before a bad request: they still go out (torch's server does the same).
        if out:
            self._write(b"".join(out) if len(out) > 1 else out[0])
        if error is not None:
            self._fail(error)
        elif handler.trusted and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.sessions.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.transport = None
        if self.handler is not None:
            self.handler.close()

    # -- the server's calls ---------------------------------------------------------------------

    def close(self) -> None:
        """Drop the connection now."""
        if self.transport is not None:
            self.transport.abort()

    def shutdown(self) -> None:
        """The server stops: close after what was answered."""
        if self.transport is not None:
            self.transport.close()

    # -- inside ---------------------------------------------------------------------------------

    def _choose(self, data: bytes) -> Handler | None:
        self._first += data
        try:
            self.handler = self.choose(self._first, self._send)
        except ValueError as e:
            log.debug("store: dropping a client: %s", e)
            self.close()
        if self.handler is not None and self.admit is not None and not self.admit(self):
            self.handler, self._refused = None, True  # logged by admit; nothing more is read
            self.close()
        return self.handler

    def _send(self, data: bytes) -> None:
        """The handler's answers: batched while it handles a read, else out at once."""
        if self._out is not None:
            self._out.append(data)
        else:
            self._write(data)

    def _write(self, data: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(data)
        if t.get_write_buffer_size() > self.MAX_UNSENT:
            log.warning("store: dropping a client that does not read its answers")
            self.close()

    def _fail(self, error: Exception) -> None:
        if isinstance(error, Refused):
            # Half-close and ignore what the client already pipelined: closing with unread input
            # would send an RST that can destroy the verdict before the client reads it. The
            # handshake deadline still closes the connection for good.
            self._refused = True
            if self.transport is not None and self.transport.can_write_eof():
                self.transport.write_eof()
        else:
            if isinstance(error, ProtocolError):
                log.debug("store: dropping a client: %s", error)
            self.close()

    def _handshake_expired(self) -> None:
        self._timer = None
        log.info("store: dropped a client that sent no handshake in %ss", self.handshake_timeout)
        self.close()
