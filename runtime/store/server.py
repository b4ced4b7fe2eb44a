"""``StoreServer``: the store's listening socket and the loop thread that serves its connections.

The server binds the address it is given (the rendezvous passes the endpoint's own address,
never 0.0.0.0), runs a ``loop.Loop`` in a daemon thread and serves two wire protocols on that
one port, told apart by the first bytes a client sends (``_choose``, the one place where a
connection's protocol is chosen). Every connection is a ``session.Session``; the protocol gives
it its handler:

* xrun's (``protocol.py``, ``handler.XrunHandler``): the agents, authenticated by the job's
  secret, on the rendezvous' ``KeySpace``;
* torch's TCPStore protocol (``torch_protocol.py``, ``torch_handler.TorchHandler``): the
  workers' ``torch.distributed.TCPStore(is_master=False)`` clients, on the *workers' key space*
  (``torch_data.py``), a separate object: a torch client cannot reach a rendezvous key.

Workers' generations: the rendezvous writes a new value to ``workers_key`` (in its own key
space) each time it forms a round, before any worker of that round can start. A torch
connection gets the workers' key space of the generation current when it arrives, a fresh
empty one for a new generation, so a restarted group never reads the previous attempt's keys
(torch's own agent creates a new store per attempt for the same reason).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from . import guard
from .data import KeySpace
from .guard import refused
from .handler import DEFAULT_HANDSHAKE_TIMEOUT, Admission, XrunHandler
from .protocol import DEFAULT_MAX_FRAME, HELLO
from .session import Handler, Session

if TYPE_CHECKING:
    from .loop import Loop
    from .torch_handler import TorchService

# What a torch client sends first (torch_protocol.HANDSHAKE_PREFIX: VALIDATE and its magic
# number). The torch modules load with the first torch connection, not on the agent's start-up.
_TORCH_FIRST = bytes.fromhex("00cef7853c")
_WARM_UP_AFTER = 0.2  # seconds after the store starts

__all__ = ["StoreServer"]


def _raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one: the store holds a socket or two per node,
    and a 1024-node job would exceed the common soft default of 1024."""
    try:
        import resource  # benchmark 1: the store's host only; agents that connect skip it

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
        workers_key: str | None = None,
    ) -> None:
        """``seed``: keys present from the start (before any client can connect).
        ``workers_key``: the key whose value names the workers' generation (see the module
        docstring); None: one workers' key space for the server's whole life."""
        self._admission = Admission(token, max_frame, handshake_timeout)
        self._workers_key = workers_key
        self._workers: TorchService | None = None
        self._workers_gen: bytes | None = None
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
        # benchmark 1: the store's host only; agents that merely connect need no event loop
        from .loop import Loop

        self._loop: Loop = Loop()
        self._data = KeySpace(self._loop, seed)
        self._sessions: set[Session] = set()
        self._loop.serve(sock, self._open_session)
        # Load torch's protocol soon, off the agent's start-up path (its modules take a few ms)
        # but before the workers connect: loading them needs file descriptors, and a store
        # whose descriptors run out must still be able to serve its torch clients.
        self._loop.call_later(_WARM_UP_AFTER, self._warm_up)
        self._thread = threading.Thread(
            target=self._run, name=f"xrun-store:{self.port}", daemon=True
        )
        self._thread.start()

    def _open_session(self) -> Session:
        """A new connection: its first bytes choose its protocol (``_choose``)."""
        return Session(
            self._choose,
            self._loop,
            self._sessions,
            self._admission.handshake_timeout,
            admit=self._admit,
        )

    def _admit(self, session: Session) -> bool:
        """A torch-protocol client is admitted from the job's nodes and user only (guard.py);
        xrun's protocol authenticates for itself (handler.py)."""
        if isinstance(session.handler, XrunHandler) or session.transport is None:
            return True
        return not refused(session.transport, self._sessions)

    def _choose(self, first: bytes, send: Callable[[bytes], None]) -> Handler | None:
        """The handler for a connection that opened with ``first``; None: not enough bytes to
        tell yet. Raises ValueError for bytes that are neither protocol."""
        n = min(len(first), len(HELLO))
        if first[:n] == HELLO[:n]:
            if n < len(HELLO):
                return None
            return XrunHandler(self._data, self._admission, send)
        n = min(len(first), len(_TORCH_FIRST))
        if first[:n] == _TORCH_FIRST[:n]:
            if n < len(_TORCH_FIRST):
                return None
            return self.workers().handler(send)
        raise ValueError(f"neither xrun's nor torch's protocol (first bytes {first[:8].hex()})")

    @staticmethod
    def _warm_up() -> None:
        # benchmark 1: in the loop thread, after start-up; every module a torch client's first
        # bytes need (a store out of descriptors cannot import one then)
        from . import quota, torch_data, torch_handler

        del quota, torch_data, torch_handler
        guard.prepare()  # the socket tables and what reads them (see guard.py), likewise

    def workers(self) -> TorchService:
        """The workers' key space (and its barriers) of the current generation (loop thread)."""
        gen = self._data.values.get(self._workers_key) if self._workers_key else None
        if self._workers is None or gen != self._workers_gen:
            # benchmark 1: once a worker's TCPStore connects (or _warm_up loaded them); the
            # workers' key space is capped (quota.py)
            from .quota import CappedKeySpace
            from .torch_data import WorkersKeySpace
            from .torch_handler import TorchService

            self._workers = TorchService(CappedKeySpace(WorkersKeySpace()))
            self._workers_gen = gen
        return self._workers

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
            guard.flush()  # the refusals counted but not logged yet
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
