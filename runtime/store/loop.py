"""The store server's event loop: ``selectors`` plus a timer heap, run by one thread.

Why not asyncio: the agent that hosts the store is on every job's start-up path, and importing
asyncio (which pulls in ssl, concurrent.futures, inspect ...) costs 15-60 ms and several MiB on
a loaded 2-core host - most of a standalone agent's overhead. The store needs only a sliver of
it: accept, read callbacks into a protocol object, buffered non-blocking writes, timers and a
thread-safe ``call_soon_threadsafe``. That sliver is this module; the protocol side
(``session.Session``) keeps asyncio's callback names (``connection_made``,
``data_received``, ``eof_received``, ``connection_lost``) and transport calls, so it reads like
the asyncio Protocol it was written as.

Standard library only, and only ``selectors``/``heapq``/``socket`` at that (``logging`` loads
when something goes wrong).
"""

from __future__ import annotations

import heapq
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..lazylog import LazyLogger

log = LazyLogger(__name__)

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_RECV_SIZE = 256 << 10
# accept() calls per readiness event: a burst of 1024 agents must not starve the others' reads.
_ACCEPT_BURST = 4096
# The longest select() sleeps, whatever the timers say (see _run_once).
_MAX_SELECT_TIMEOUT = 60.0
# How long accepts pause after accept() failed (EMFILE: no file descriptor left).
_ACCEPT_PAUSE = 0.5


class StreamProtocol(Protocol):
    """What a connection's handler implements (asyncio's Protocol names)."""

    def connection_made(self, transport: Transport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...


class TimerHandle:
    """A call scheduled by ``Loop.call_later``; ``cancel()`` makes it a no-op."""

    __slots__ = ("when", "seq", "fn", "args", "loop")

    def __init__(
        self, when: float, seq: int, fn: Callable[..., Any], args: tuple[Any, ...], loop: Loop
    ) -> None:
        self.when, self.seq, self.fn, self.args, self.loop = when, seq, fn, args, loop

    def __lt__(self, other: TimerHandle) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)

    def cancel(self) -> None:
        if self.fn is not None:
            self.fn, self.args = None, ()  # type: ignore[assignment]  # drop references now
            self.loop._cancelled += 1


class Loop:
    """One thread's loop: ``serve(sock, factory)``, then ``run_forever()`` until ``stop()``."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._timers: list[TimerHandle] = []
        self._cancelled = 0  # cancelled handles still in the heap
        self._seq = 0
        self._ready: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()  # guards _ready for call_soon_threadsafe
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, _READ, self._on_wake)
        self._transports: set[Transport] = set()
        self._listeners: list[socket.socket] = []
        self._rbuf = memoryview(bytearray(_RECV_SIZE))  # every connection reads into it
        self._running = False
        self._closed = False

    # -- scheduling ------------------------------------------------------------------------------

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> TimerHandle:
        self._seq += 1
        h = TimerHandle(time.monotonic() + delay, self._seq, fn, args, self)
        heapq.heappush(self._timers, h)
        return h

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._ready.append((fn, args))

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        self.call_soon(fn, *args)
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a full wakeup pipe already wakes the loop; a closed one: loop is gone

    def _on_wake(self, mask: int) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # -- serving ---------------------------------------------------------------------------------

    def serve(self, sock: socket.socket, factory: Callable[[], StreamProtocol]) -> None:
        """Accept connections on the listening ``sock``, one ``factory()`` protocol each."""
        sock.setblocking(False)
        self._listeners.append(sock)
        self._sel.register(sock, _READ, lambda mask: self._accept(sock, factory))

    def close_listeners(self) -> None:
        for sock in self._listeners:
            self._unregister(sock)
            sock.close()
        self._listeners.clear()

    def _accept(self, sock: socket.socket, factory: Callable[[], StreamProtocol]) -> None:
        for _ in range(_ACCEPT_BURST):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                # EMFILE and friends: the pending connection stays in the backlog; stop accepting
                # for a moment rather than spin on it, and serve the connections we have.
                log.warning("store: accept failed (%s); pausing accepts for %ss", e, _ACCEPT_PAUSE)
                self._unregister(sock)
                self.call_later(_ACCEPT_PAUSE, self._resume_accept, sock, factory)
                return
            try:
                Transport(self, conn, factory())
            except Exception:  # e.g. no fd left for a session's timer or nonce: lose only it
                log.exception("store: could not set up an accepted connection")
                conn.close()

    def _resume_accept(self, sock: socket.socket, factory: Callable[[], StreamProtocol]) -> None:
        if sock in self._listeners:
            self._sel.register(sock, _READ, lambda mask: self._accept(sock, factory))

    def _unregister(self, sock: socket.socket) -> None:
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    # -- running ---------------------------------------------------------------------------------

    def run_forever(self) -> None:
        self._running = True
        try:
            while self._running:
                try:
                    self._run_once()
                except Exception:  # whatever it was, the store keeps serving the others
                    log.exception("store: error in the event loop")
                    time.sleep(0.01)  # not a busy loop if it keeps happening
        finally:
            self._running = False

    def stop(self) -> None:
        """Return from ``run_forever`` after the current iteration (loop thread only)."""
        self._running = False

    def is_closed(self) -> bool:
        return self._closed

    def has_transports(self) -> bool:
        """Whether any connection is still open (closing ones included)."""
        return bool(self._transports)

    def _run_once(self) -> None:
        timers = self._timers
        if self._cancelled > 64 and self._cancelled * 2 > len(timers):
            # Lease renewals cancel a timer per heartbeat: rebuild rather than let them pile up.
            self._timers = timers = [h for h in timers if h.fn is not None]
            heapq.heapify(timers)
            self._cancelled = 0
        if self._ready:
            timeout: float | None = 0.0
        elif timers:
            # Bounded: a timer may lie centuries ahead (a lease "forever", a client's absurd
            # wait timeout), and select() refuses a timeout epoll cannot hold (OverflowError,
            # which used to end the loop thread). Waking once a minute costs nothing.
            timeout = min(_MAX_SELECT_TIMEOUT, max(0.0, timers[0].when - time.monotonic()))
        else:
            timeout = None
        try:
            events = self._sel.select(timeout)
        except InterruptedError:
            events = []
        for key, mask in events:
            try:
                key.data(mask)
            except Exception:  # one connection's bug (or a failed accept) must not end the loop
                log.exception("store: error handling an event")
                owner = getattr(key.data, "__self__", None)
                if isinstance(owner, Transport):
                    owner.abort()
        now = time.monotonic()
        while timers and timers[0].when <= now:
            h = heapq.heappop(timers)
            if h.fn is None:
                self._cancelled -= 1
                continue
            fn, args = h.fn, h.args
            h.fn, h.args = None, ()  # type: ignore[assignment]
            self._call(fn, args)
        with self._lock:
            ready, self._ready = self._ready, deque()
        for fn, args in ready:
            self._call(fn, args)

    @staticmethod
    def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:  # one callback's bug must not stop the store
            log.exception("store: error in a loop callback")

    def close(self) -> None:
        """Drop every connection and free the loop's resources (after ``run_forever``)."""
        if self._closed:
            return
        self.close_listeners()
        for t in list(self._transports):
            t.abort()
        with self._lock:
            ready, self._ready = self._ready, deque()
        for fn, args in ready:  # the connection_lost calls just scheduled
            self._call(fn, args)
        self._timers.clear()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        self._closed = True


class Transport:
    """One accepted connection: reads feed ``protocol.data_received``; ``write`` sends at once
    what the socket takes and buffers the rest (sent when the socket turns writable)."""

    def __init__(self, loop: Loop, sock: socket.socket, protocol: StreamProtocol) -> None:
        self._loop = loop
        self._sock = sock
        self._protocol = protocol
        self._buf = bytearray()
        self._reading = True
        self._closing = False  # close() called: flush, then close
        self._eof_pending = False  # write_eof() called while data was buffered
        self._closed = False
        sock.setblocking(False)
        loop._transports.add(self)
        try:
            loop._sel.register(sock, _READ, self._on_event)
            protocol.connection_made(self)
        except BaseException:
            self._lose(None)
            raise

    # -- asyncio.Transport's calls that a session makes -------------------------------------------

    def get_extra_info(self, name: str) -> Any:
        return self._sock if name == "socket" else None

    def write(self, data: bytes) -> None:
        if self._closed or self._closing or not data:
            return
        if not self._buf:
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._lose(e)
                return
            if n == len(data):
                return
            data = data[n:]
            self._buf += data
            self._update()
        else:
            self._buf += data

    def get_write_buffer_size(self) -> int:
        return len(self._buf)

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._buf:
            self._eof_pending = True
        else:
            self._shutdown_write()

    def close(self) -> None:
        """Stop reading, send what is buffered, then close."""
        if self._closing or self._closed:
            return
        self._closing = True
        self._reading = False
        if self._buf:
            self._update()
        else:
            self._lose(None)

    def abort(self) -> None:
        """Close now, dropping anything unsent."""
        self._lose(None)

    # -- the loop's side -------------------------------------------------------------------------

    def _update(self) -> None:
        if self._closed:
            return
        mask = (_READ if self._reading else 0) | (_WRITE if self._buf else 0)
        sel = self._loop._sel
        if not mask:
            self._loop._unregister(self._sock)
            return
        try:
            sel.modify(self._sock, mask, self._on_event)
        except KeyError:  # unregistered while it had nothing to wait for
            sel.register(self._sock, mask, self._on_event)

    def _on_event(self, mask: int) -> None:
        if mask & _READ and self._reading and not self._closed:
            self._read()
        if mask & _WRITE and not self._closed:
            self._flush()

    def _read(self) -> None:
        # Into the loop's one buffer, then a copy of what came: recv(256 KiB) would allocate
        # (mmap), shrink (mremap) and free (munmap) a buffer per call - three system calls more
        # than the recv itself, half the store's time under many small requests.
        buf = self._loop._rbuf
        try:
            n = self._sock.recv_into(buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lose(e)
            return
        if n:
            self._protocol.data_received(bytes(buf[:n]))
            return
        # EOF: asyncio's rule - unless eof_received says "keep open", close our side too.
        self._reading = False
        if self._protocol.eof_received():
            self._update()
        else:
            self.close()

    def _flush(self) -> None:
        try:
            n = self._sock.send(self._buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lose(e)
            return
        del self._buf[:n]
        if self._buf:
            return
        if self._closing:
            self._lose(None)
            return
        if self._eof_pending:
            self._shutdown_write()
        self._update()

    def _shutdown_write(self) -> None:
        self._eof_pending = False
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _lose(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = self._closing = True
        self._reading = False
        self._loop._unregister(self._sock)
        self._loop._transports.discard(self)
        self._sock.close()
        self._buf.clear()
        # Later, not from inside the caller's own callback (asyncio's order): connection_lost
        # may fire leases and answer other connections' waits.
        self._loop.call_soon(self._protocol.connection_lost, exc)
