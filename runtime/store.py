"""xrun's key-value store: a small TCP server (a selectors loop in a background thread, see
``_loop.py``) and a blocking client.

The rendezvous (``runtime/rendezvous.py``) is built on it; the agent uses it through
``RendezvousHandler.kv()``. Standard library only.

Design for scale: every op touches one key or a short list of keys (per-node keys, atomic
counters), and blocking waits happen on the server (``WAIT`` parks the request until its keys
exist), so N clients cost O(N) messages, never a compare-and-set storm or client polling.

Wire protocol (version 1)
-------------------------
Everything travels in *frames*: a 4-byte big-endian unsigned length ``N`` then ``N`` bytes.
A frame longer than the server's ``max_frame`` (default 4 MiB) closes the connection.

Handshake (before any request):

1. server -> client: ``b"XRUNKV1"`` + flags (1 byte, bit 0 = a token is required) + 16-byte nonce
2. client -> server: ``b"XRUNKV1"`` + MAC, where MAC = HMAC-SHA256(token, ``b"xrun-kv-auth"`` +
   nonce) (32 bytes) or empty when the client has no token
3. server -> client: ``b"\\x00"`` (accepted) or ``b"\\x01"`` + a UTF-8 reason, then it closes.
   A client may send its first requests right behind step 2 and read the verdict with their
   answers (the rendezvous does: one round trip less per agent).

A client that does not finish step 2 within ``handshake_timeout`` is dropped. The MAC is
compared in constant time and the token itself never crosses the wire.

Requests: ``id:u32 op:u8`` + fields; responses: ``id:u32 status:u8`` + fields.
Field encodings: ``str``/``bytes`` = ``len:u32`` + bytes (keys are UTF-8), ``i64`` and ``f64``
big-endian. status: 0 OK, 1 TIMEOUT, 2 ERROR (then one ``str`` field: the message).
A request with id 0 gets no response (fire-and-forget, used for heartbeats).

==========  ===================================================  ==============================
op          request fields                                       OK response fields
==========  ===================================================  ==============================
SET    1    key, value                                           -
ADD    2    key, delta:i64 (value stored as ASCII decimal)       new value:i64
WAIT   3    mode:u8 (0 all, 1 any), timeout:f64 (<0 = forever),  count:u32, then per key
            count:u32, keys...                                   present:u8 [value]
DELETE 4    key                                                  -
LEASE  5    lease key, ttl:f64 (0 = release), fire key,          -
            fire value, flags:u8: unless renewed within ttl, the
            server SETs fire key = fire value (waking its
            waiters). flags bit 0: this connection owns the
            lease, and it fires at once if the connection closes
            (a SIGKILLed agent is noticed at once, not after ttl)
PING   6    -                                                    -
==========  ===================================================  ==============================

``WAIT`` with timeout 0 is a non-blocking multi-get. A TIMEOUT response carries the same
fields as OK (what was present when time ran out). Answers to parked WAITs may overtake later
answers on the same connection; clients match them by id.

Limits that keep one bad client from hurting the others: frames over ``max_frame`` and bytes that
do not parse close that connection; before it authenticates a client may send no frame over
256 bytes, and one that does not authenticate within ``handshake_timeout`` is dropped; at most
256 parked waits per connection; a client that leaves more than 64 MiB of answers unread is
dropped. The server binds the address it is given (the rendezvous passes the endpoint's own
address, never 0.0.0.0).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import logging
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Imported for real only by StoreServer: agents that merely connect need no event loop.
    from xrun.runtime._loop import Loop, TimerHandle, Transport

log = logging.getLogger(__name__)

MAGIC = b"XRUNKV1"
AUTH_CONTEXT = b"xrun-kv-auth"
NONCE_LEN = 16
DEFAULT_MAX_FRAME = 4 << 20
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
MAX_HANDSHAKE_FRAME = 256
# A misbehaving client must not pin unbounded server memory with parked waits.
MAX_WAITS_PER_CONNECTION = 256

_LEN = struct.Struct("!I")
_HEAD = struct.Struct("!IB")
_I64 = struct.Struct("!q")
_F64 = struct.Struct("!d")


class Op(enum.IntEnum):
    SET = 1
    ADD = 2
    WAIT = 3
    DELETE = 4
    LEASE = 5
    PING = 6


class Status(enum.IntEnum):
    OK = 0
    TIMEOUT = 1
    ERROR = 2


class StoreError(Exception):
    """The store could not be reached, or answered with an error."""


class StoreAuthError(StoreError):
    """The store rejected this client's token (or lack of one)."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking wait (or a read) ran out of time."""


class ProtocolError(StoreError):
    """The peer sent bytes that are not valid protocol."""


# ---------------------------------------------------------------------------------------------
# Encoding helpers (shared by both sides)


def _pack_bytes(b: bytes) -> bytes:
    return _LEN.pack(len(b)) + b


class _Reader:
    """Sequential decoder over one frame body; raises ProtocolError on truncation."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise ProtocolError(f"truncated frame: wanted {n} bytes at offset {self.pos}")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        return int(_LEN.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def f64(self) -> float:
        return float(_F64.unpack(self._take(8))[0])

    def bytes_(self) -> bytes:
        return self._take(self.u32())

    def str_(self) -> str:
        try:
            return self.bytes_().decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"key is not UTF-8: {e}") from None


def auth_mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, AUTH_CONTEXT + nonce, hashlib.sha256).digest()


# ---------------------------------------------------------------------------------------------
# Server
#
# A Protocol (callbacks on the loop) rather than streams: a connection costs no task,
# every complete frame of one read is handled in one go, and the answers to one read leave in
# one send. That matters when 1024 agents hit one store, and more when they are threads of one
# process fighting over the GIL (the benchmark): every send/recv is a GIL hand-off.


@dataclass(eq=False)
class _Waiter:
    conn: _Conn
    rid: int
    keys: tuple[str, ...]
    want_all: bool
    timer: TimerHandle | None = None


@dataclass(eq=False)
class _Lease:
    fire_key: str
    fire_value: bytes
    timer: TimerHandle
    owner: _Conn | None  # the connection whose loss fires it (None: only the timer does)


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


class _Data:
    """The key space, its parked waits and its leases. Runs on the loop thread only."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.values: dict[str, bytes] = {}
        self.waiters: dict[str, set[_Waiter]] = {}
        self.leases: dict[str, _Lease] = {}

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value
        waiters = self.waiters.get(key)
        if not waiters:
            return
        for w in list(waiters):
            if not w.want_all or all(k in self.values for k in w.keys):
                self.finish_wait(w, True)

    def add(self, key: str, delta: int) -> int:
        old = self.values.get(key, b"0")
        try:
            new = int(old) + delta
        except ValueError:
            raise StoreError(
                f"ADD on key {key!r} whose value {old[:40]!r} is not an integer"
            ) from None
        self.put(key, str(new).encode())
        return new

    def ready(self, keys: tuple[str, ...], want_all: bool) -> bool:
        vals = self.values
        return not keys or (all if want_all else any)(k in vals for k in keys)

    def present(self, keys: Sequence[str]) -> bytes:
        vals = self.values
        parts = [_LEN.pack(len(keys))]
        for k in keys:
            v = vals.get(k)
            parts.append(b"\x00" if v is None else b"\x01" + _LEN.pack(len(v)) + v)
        return b"".join(parts)

    def park(self, w: _Waiter, timeout: float) -> None:
        for k in w.keys:
            self.waiters.setdefault(k, set()).add(w)
        if timeout > 0:
            w.timer = self.loop.call_later(timeout, self.finish_wait, w, False)

    def unpark(self, w: _Waiter) -> None:
        if w.timer is not None:
            w.timer.cancel()
        for k in w.keys:
            s = self.waiters.get(k)
            if s is not None:
                s.discard(w)
                if not s:
                    del self.waiters[k]

    def finish_wait(self, w: _Waiter, ok: bool) -> None:
        self.unpark(w)
        w.conn.waits.discard(w)
        w.conn.reply(w.rid, Status.OK if ok else Status.TIMEOUT, self.present(w.keys))
        w.conn.flush()

    def lease(
        self, key: str, ttl: float, fire_key: str, fire_value: bytes, owner: _Conn | None
    ) -> None:
        old = self.leases.pop(key, None)
        if old is not None:
            old.timer.cancel()
            owner = owner or old.owner  # a renewal from another connection keeps the owner
        if ttl <= 0:
            return
        timer = self.loop.call_later(ttl, self.fire_lease, key)
        self.leases[key] = _Lease(fire_key, fire_value, timer, owner)

    def fire_lease(self, key: str) -> None:
        lease = self.leases.pop(key, None)
        if lease is None:
            return
        lease.timer.cancel()
        if lease.fire_key not in self.values:
            self.put(lease.fire_key, lease.fire_value)

    def drop_owner(self, owner: _Conn, keys: set[str]) -> None:
        for key in keys:
            lease = self.leases.get(key)
            if lease is not None and lease.owner is owner:
                self.fire_lease(key)

    def clear_timers(self) -> None:
        for lease in self.leases.values():
            lease.timer.cancel()
        self.leases.clear()


class _Conn:
    """One client connection, a ``_loop.StreamProtocol`` (asyncio's Protocol callbacks):
    handshake, then frames in, answers out."""

    # Answers a client does not read pile up in the transport; past this, drop the client.
    MAX_UNSENT = 64 << 20

    def __init__(self, server: StoreServer) -> None:
        self.server = server
        self.data = server._data
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.transport: Transport | None = None
        self.nonce = b""
        self.authed = False
        self.rejected = False
        self.waits: set[_Waiter] = set()
        self.owned_leases: set[str] = set()
        self.hs_timer: TimerHandle | None = None

    # -- loop callbacks -------------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:
        self.transport = transport
        self.server._conns.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The nonce only matters when a token is checked (and urandom is a system call).
        self.nonce = os.urandom(NONCE_LEN) if self.server._token else bytes(NONCE_LEN)
        flags = 1 if self.server._token else 0
        transport.write(_pack_bytes(MAGIC + bytes([flags]) + self.nonce))
        self.hs_timer = self.server._loop.call_later(
            self.server._handshake_timeout, self._handshake_expired
        )

    def data_received(self, data: bytes) -> None:
        if self.rejected:
            return  # swallow what a refused client pipelined (see _refuse)
        buf = self.buf
        buf += data
        max_frame = self.server._max_frame
        try:
            pos = 0
            while len(buf) - pos >= 4:
                (n,) = _LEN.unpack_from(buf, pos)
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
        self.server._conns.discard(self)
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
            self.out.append(
                _LEN.pack(_HEAD.size + len(payload)) + _HEAD.pack(rid, status) + payload
            )

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

    def _handshake_expired(self) -> None:
        if not self.authed:
            log.info(
                "store: dropped a client that sent no handshake in %ss",
                self.server._handshake_timeout,
            )
            self.close()

    def _handshake(self, body: bytes) -> None:
        if not body.startswith(MAGIC):
            raise ProtocolError("bad handshake")
        token = self.server._token
        mac = body[len(MAGIC) :]
        if token is not None and not hmac.compare_digest(mac, auth_mac(token, self.nonce)):
            self._refuse()
            return
        if self.hs_timer is not None:
            self.hs_timer.cancel()
        self.authed = True
        self.out.append(_pack_bytes(b"\x00"))

    def _refuse(self) -> None:
        # Half-close and ignore what the client already pipelined: closing with unread input
        # would send an RST that can destroy the verdict before the client reads it. The
        # handshake timer still closes the connection for good.
        assert self.transport is not None
        self.rejected = True
        self.transport.write(_pack_bytes(b"\x01wrong or missing token for this rendezvous store"))
        if self.transport.can_write_eof():
            self.transport.write_eof()

    def _dispatch(self, body: bytes) -> None:
        r = _Reader(body)
        rid = r.u32()
        op = r.u8()
        data = self.data
        try:
            if op == Op.WAIT:
                want_all = r.u8() == 0
                timeout = r.f64()
                keys = tuple(r.str_() for _ in range(r.u32()))
                if timeout == 0 or data.ready(keys, want_all):
                    ok = data.ready(keys, want_all)
                    self.reply(rid, Status.OK if ok else Status.TIMEOUT, data.present(keys))
                    return
                if len(self.waits) >= MAX_WAITS_PER_CONNECTION:
                    raise StoreError(
                        f"more than {MAX_WAITS_PER_CONNECTION} waits on one connection"
                    )
                w = _Waiter(self, rid, keys, want_all)
                self.waits.add(w)
                data.park(w, timeout)
                return
            payload = b""
            if op == Op.SET:
                key = r.str_()
                data.put(key, r.bytes_())
            elif op == Op.ADD:
                key = r.str_()
                payload = _I64.pack(data.add(key, r.i64()))
            elif op == Op.DELETE:
                data.values.pop(r.str_(), None)
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
            self.reply(rid, Status.ERROR, _pack_bytes(str(e).encode()))
        else:
            self.reply(rid, Status.OK, payload)


class StoreServer:
    """The store, served by a ``_loop.Loop`` in a daemon thread.

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
        self._token = token
        self._max_frame = max_frame
        self._handshake_timeout = handshake_timeout
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
        from xrun.runtime._loop import Loop

        self._loop = Loop()
        self._data = _Data(self._loop)
        self._data.values.update(seed or {})
        self._conns: set[_Conn] = set()
        self._loop.serve(sock, lambda: _Conn(self))
        self._thread = threading.Thread(
            target=self._run, name=f"xrun-store:{self.port}", daemon=True
        )
        self._thread.start()

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
            for c in list(self._conns):
                c.flush()
                if c.transport is not None:
                    c.transport.close()  # sends what is buffered, then closes
            self._drain(time.monotonic() + 1.0)

        self._loop.call_soon_threadsafe(_stop)
        self._thread.join(timeout=5)

    def _drain(self, deadline: float) -> None:
        """Keep the loop turning until the closing connections have sent their answers (a
        client that reads nothing gets at most until ``deadline``), then stop it."""
        if self._loop._transports and time.monotonic() < deadline:
            self._loop.call_later(0.005, self._drain, deadline)
        else:
            self._loop.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


# ---------------------------------------------------------------------------------------------
# Client


@dataclass(frozen=True)
class Response:
    rid: int
    status: Status
    body: _Reader

    def values(self) -> list[bytes | None]:
        """Decode a WAIT response: one entry per requested key (None = absent)."""
        out: list[bytes | None] = []
        for _ in range(self.body.u32()):
            out.append(self.body.bytes_() if self.body.u8() else None)
        return out


def encode_request(rid: int, op: Op, *fields: bytes) -> bytes:
    body = _HEAD.pack(rid, op) + b"".join(fields)
    return _LEN.pack(len(body)) + body


def wait_fields(keys: Sequence[str], want_all: bool, timeout: float | None) -> bytes:
    t = -1.0 if timeout is None else max(0.0, timeout)
    head = bytes([0 if want_all else 1]) + _F64.pack(t) + _LEN.pack(len(keys))
    return head + b"".join(_pack_bytes(k.encode()) for k in keys)


def add_fields(key: str, delta: int) -> bytes:
    return _pack_bytes(key.encode()) + _I64.pack(delta)


def lease_fields(
    key: str, ttl: float, fire_key: str, fire_value: bytes, fire_on_disconnect: bool = False
) -> bytes:
    return (
        _pack_bytes(key.encode())
        + _F64.pack(ttl)
        + _pack_bytes(fire_key.encode())
        + _pack_bytes(fire_value)
        + bytes([1 if fire_on_disconnect else 0])
    )


def is_ip_literal(host: str) -> bool:
    """``host`` is an IPv4/IPv6 address, not a name to resolve."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            pass
    return False


class Connection:
    """One authenticated socket to the store: frames in (read ahead into a buffer, so one recv
    usually yields a whole answer), frames out. Not thread-safe by itself."""

    def __init__(self, sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self._rbuf = bytearray()
        self._pending: list[bytes] = []  # queued frames, sent with the next send()
        # When the answer being read is overdue (None: never). The socket itself keeps one short
        # timeout for good: settimeout is a system call that releases the GIL, and changing it
        # per request costs more than waking up every few seconds to check this deadline.
        self.deadline: float | None = None
        self._needs_token = False
        self._verdict_pending = False

    @classmethod
    def open(
        cls,
        host: str,
        port: int,
        token: bytes | None,
        *,
        deadline: float,
        read_timeout: float,
        lazy_verdict: bool = False,
    ) -> Connection:
        """Connect, retrying with jittered exponential backoff until ``deadline`` (monotonic).

        Retrying covers the usual start-up race: agents on other hosts start before the one that
        serves the store. Authentication failures are not retried: they will not fix themselves.
        With ``lazy_verdict`` our credentials leave with the first request and the server's
        verdict is read with its answer (one round trip less; a refusal surfaces on that call).
        """
        delay = 0.02
        while True:
            remaining = deadline - time.monotonic()
            try:
                sock = cls._connect(
                    host, port, max(0.05, min(read_timeout, remaining)), read_timeout
                )
            except OSError as e:
                if time.monotonic() + delay >= deadline:
                    raise StoreTimeoutError(
                        f"could not reach the rendezvous store at {host}:{port}: {e}"
                    ) from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
                continue
            conn = cls(sock)
            try:
                conn.deadline = time.monotonic() + read_timeout
                conn._authenticate(token, lazy_verdict)
                conn.deadline = None
            except BaseException:
                sock.close()
                raise
            return conn

    @staticmethod
    def _connect(host: str, port: int, timeout: float, read_timeout: float) -> socket.socket:
        if not is_ip_literal(host):
            sock = socket.create_connection((host, port), timeout=timeout)
        else:  # skip getaddrinfo: one system call (and GIL hand-off) less per connection
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            try:
                sock.settimeout(timeout)
                sock.connect((host, port))
            except BaseException:
                sock.close()
                raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tick = min(read_timeout, 2.0)
        if tick != timeout:
            sock.settimeout(tick)
        return sock

    def _authenticate(self, token: bytes | None, lazy_verdict: bool = False) -> None:
        try:
            hello = self.recv_frame()
        except (ConnectionError, TimeoutError, OSError) as e:
            raise StoreError(f"the store did not greet us: {e}") from None
        if not hello.startswith(MAGIC) or len(hello) != len(MAGIC) + 1 + NONCE_LEN:
            raise ProtocolError(f"the peer is not an xrun store (greeting {hello[:16]!r})")
        self._needs_token = bool(hello[len(MAGIC)] & 1)
        nonce = hello[len(MAGIC) + 1 :]
        mac = auth_mac(token, nonce) if token is not None else b""
        self.queue(_pack_bytes(MAGIC + mac))
        self._verdict_pending = True
        if not lazy_verdict:
            self.send(b"")
            self._read_verdict()

    def _read_verdict(self) -> None:
        self._verdict_pending = False
        try:
            verdict = self.recv_frame()
        except ConnectionError:
            verdict = b"\x01the store closed the connection during the handshake"
        except TimeoutError:
            raise StoreTimeoutError("the store did not answer our handshake") from None
        if verdict != b"\x00":
            reason = verdict[1:].decode(errors="replace")
            hint = (
                "set XRUN_RDZV_TOKEN (or XRUN_RDZV_TOKEN_FILE, or rdzv conf token_file) to the job's secret"
                if self._needs_token
                else "check that the endpoint belongs to this job"
            )
            raise StoreAuthError(f"the store refused us: {reason}; {hint}")

    def queue(self, frame: bytes) -> None:
        """Send ``frame`` with the next ``send`` (fire-and-forget requests ride along)."""
        self._pending.append(frame)

    def send(self, data: bytes) -> None:
        if self._pending:
            data = b"".join([*self._pending, data])
            self._pending.clear()
        if data:
            self.sock.sendall(data)

    def _fill(self, need: int) -> None:
        buf = self._rbuf
        while len(buf) < need:
            try:
                chunk = self.sock.recv(max(65536, need - len(buf)))
            except TimeoutError:
                if self.deadline is None or time.monotonic() < self.deadline:
                    continue
                raise
            if not chunk:
                raise ConnectionError("the store closed the connection")
            buf += chunk

    def recv_frame(self) -> bytes:
        self._fill(4)
        (n,) = _LEN.unpack_from(self._rbuf)
        if n > self.max_frame:
            raise ProtocolError(f"frame of {n} bytes exceeds the {self.max_frame}-byte limit")
        self._fill(4 + n)
        frame = bytes(self._rbuf[4 : 4 + n])
        del self._rbuf[: 4 + n]
        return frame

    def recv_response(self) -> Response:
        if self._verdict_pending:
            self._read_verdict()
        r = _Reader(self.recv_frame())
        rid = r.u32()
        return Response(rid, Status(r.u8()), r)

    def readable(self) -> bool:
        """A frame (or EOF) can be read without blocking."""
        if len(self._rbuf) >= 4 and len(self._rbuf) >= 4 + _LEN.unpack_from(self._rbuf)[0]:
            return True
        return bool(select.select([self.sock], [], [], 0)[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class StoreClient:
    """A blocking, thread-safe client: one request in flight at a time on one connection."""

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes | None = None,
        *,
        connect_timeout: float = 60.0,
        read_timeout: float = 60.0,
        lazy_verdict: bool = False,
    ) -> None:
        self.host, self.port = host, port
        self.read_timeout = read_timeout
        self._conn = Connection.open(
            host,
            port,
            token,
            deadline=time.monotonic() + connect_timeout,
            read_timeout=read_timeout,
            lazy_verdict=lazy_verdict,
        )
        self._lock = threading.Lock()
        self._next_id = 1

    def _call(self, op: Op, *fields: bytes, wait: float | None = 0.0) -> Response:
        return self.pipeline([(op, fields)], wait=wait)[0]

    def pipeline(
        self, calls: Sequence[tuple[Op, tuple[bytes, ...]]], *, wait: float | None = 0.0
    ) -> list[Response]:
        """Send several requests at once and read their answers in order (one round trip).

        ``wait`` is the longest server-side wait among them (None: unbounded); the answers are
        overdue ``read_timeout`` seconds after that.
        """
        with self._lock:
            first = self._next_id
            rids = [(first + k - 1) % 0xFFFFFFFF + 1 for k in range(len(calls))]
            self._next_id = rids[-1] % 0xFFFFFFFF + 1
            # A parked wait may legitimately take `timeout`; read_timeout bounds the rest.
            self._conn.deadline = (
                None if wait is None else time.monotonic() + wait + self.read_timeout
            )
            try:
                self._conn.send(
                    b"".join(
                        encode_request(rid, op, *f)
                        for rid, (op, f) in zip(rids, calls, strict=True)
                    )
                )
                # Answers to parked waits may overtake earlier ones: match them by id.
                by_id: dict[int, Response] = {}
                while len(by_id) < len(rids):
                    resp = self._conn.recv_response()
                    if resp.rid not in rids:
                        raise ProtocolError(f"response id {resp.rid} matches no request in {rids}")
                    by_id[resp.rid] = resp
                resps = [by_id[rid] for rid in rids]
            except TimeoutError:
                raise StoreTimeoutError(
                    f"the store at {self.host}:{self.port} did not answer within "
                    f"{self.read_timeout}s (read_timeout)"
                ) from None
            except StoreError:
                raise
            except (ConnectionError, OSError) as e:
                raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None
        for resp in resps:
            if resp.status == Status.ERROR:
                raise StoreError(resp.body.str_())
        return resps

    def set(self, key: str, value: bytes) -> None:
        self._call(Op.SET, _pack_bytes(key.encode()), _pack_bytes(value))

    def post(self, op: Op, *fields: bytes) -> None:
        """Queue a request that gets no answer (request id 0); it leaves with the next call.

        The server handles one connection's requests in order, so that next call already sees
        its effect; an error in it closes the connection and surfaces on that call.
        """
        with self._lock:
            self._conn.queue(encode_request(0, op, *fields))

    def post_set(self, key: str, value: bytes) -> None:
        self.post(Op.SET, _pack_bytes(key.encode()), _pack_bytes(value))

    def post_lease(
        self,
        key: str,
        ttl: float,
        fire_key: str,
        fire_value: bytes,
        fire_on_disconnect: bool = False,
    ) -> None:
        self.post(Op.LEASE, lease_fields(key, ttl, fire_key, fire_value, fire_on_disconnect))

    def add(self, key: str, delta: int) -> int:
        return self._call(Op.ADD, add_fields(key, delta)).body.i64()

    def delete(self, key: str) -> None:
        self._call(Op.DELETE, _pack_bytes(key.encode()))

    def ping(self) -> None:
        self._call(Op.PING)

    def lease(
        self,
        key: str,
        ttl: float,
        fire_key: str,
        fire_value: bytes,
        fire_on_disconnect: bool = False,
    ) -> None:
        """Unless renewed (same call) within ``ttl`` s, the store sets ``fire_key``; ttl 0 releases."""
        self._call(Op.LEASE, lease_fields(key, ttl, fire_key, fire_value, fire_on_disconnect))

    def get(self, key: str) -> bytes | None:
        """The value, or None when absent (non-blocking)."""
        return self.multi_get([key])[0]

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return self._call(Op.WAIT, wait_fields(keys, True, 0)).values()

    def wait(
        self, keys: Sequence[str], *, want_all: bool = True, timeout: float | None = None
    ) -> list[bytes | None] | None:
        """Block (on the server) until all/any of ``keys`` exist; their values, or None on timeout."""
        resp = self._call(Op.WAIT, wait_fields(keys, want_all, timeout), wait=timeout)
        values = resp.values()
        return None if resp.status == Status.TIMEOUT else values

    def close(self) -> None:
        self._conn.close()
