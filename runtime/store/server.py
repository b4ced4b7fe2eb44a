"""``StoreServer``: the store's listening socket and the loop thread that serves its connections.

The server binds the address it is given (the rendezvous passes the endpoint's own address,
never 0.0.0.0), runs a ``loop.Loop`` in a daemon thread and gives every accepted connection a
session of one wire protocol (``_open_session``, the one place where that choice is made);
every session works on the same ``KeySpace``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from .data import KeySpace
from .protocol import DEFAULT_MAX_FRAME
from .session import DEFAULT_HANDSHAKE_TIMEOUT, Admission, XrunSession

if TYPE_CHECKING:
    from .loop import Loop, Transport

__all__ = ["StoreServer"]


class Session(Protocol):
    """A connection's protocol handler: ``loop.StreamProtocol``'s callbacks, plus ``shutdown``
    (send what was answered, then close) for a server that stops."""

    def connection_made(self, transport: Transport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def shutdown(self) -> None: ...


def _raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one: the store holds a socket or two per node,
    and a 1024-node job would exceed the common soft default of 1024."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


class StoreServer:
    """The store, served by a ``loop.Loop`` in a daemon thread.

    The listening socket is bound in ``__init__`` (so ``OSError(EADDRINUSE)`` reaches the caller,
    who then knows another agent on this host won the race and connects as a client).
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes | None = None,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        backlog: int = 4096,
        seed: Mapping[str, bytes] | None = None,
    ) -> None:
        """``seed``: keys present from the start (before any client can connect)."""
        self._admission = Admission(token, max_frame, handshake_timeout)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        if not infos:
            raise OSError(f"cannot resolve {host!r}")
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR lets a restarted job rebind a port left in TIME_WAIT; it does not let two
            # live listeners share a port on Linux (that needs SO_REUSEPORT, which we never set).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            # A deep backlog: a burst of 1024 agents overflowing a short one stalls on SYN
            # retransmits (1 s, 3 s, ...).
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        self.host, self.port = sock.getsockname()[:2]
        _raise_fd_limit()
        # Imported here: agents that merely connect to a store need no event loop.
        from .loop import Loop

        self._loop: Loop = Loop()
        self._data = KeySpace(self._loop, seed)
        self._sessions: set[Session] = set()
        self._loop.serve(sock, self._open_session)
        self._thread = threading.Thread(
            target=self._run, name=f"xrun-store:{self.port}", daemon=True
        )
        self._thread.start()

    def _open_session(self) -> Session:
        """The protocol a new connection speaks: the one place where it is chosen.

        xrun's protocol is the only one so far, and its server speaks first (the greeting
        carries the nonce), so every connection gets an ``XrunSession`` at once. A second
        protocol on the same port (torch's TCPStore, issue #14), told apart by the first bytes
        the *client* sends, needs a session that waits for those bytes before it hands the
        connection to the matching protocol, and so an xrun handshake in which the client
        speaks first.
        """
        return XrunSession(self._data, self._loop, self._sessions, self._admission)

    def _run(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def stop(self) -> None:
        """Close every connection (after sending what was answered) and the listening socket;
        idempotent."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return

        def _stop() -> None:
            self._loop.close_listeners()
            self._data.clear_timers()
            for s in list(self._sessions):
                s.shutdown()  # sends what is buffered, then closes
            self._drain(time.monotonic() + 1.0)

        self._loop.call_soon_threadsafe(_stop)
        self._thread.join(timeout=5)

    def _drain(self, deadline: float) -> None:
        """Keep the loop turning until the closing connections have sent their answers (a
        client that reads nothing gets at most until ``deadline``), then stop it."""
        if self._loop.has_transports() and time.monotonic() < deadline:
            self._loop.call_later(0.005, self._drain, deadline)
        else:
            self._loop.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
