"""xrun's key-value store: a small TCP server (asyncio, in a background thread) and a blocking client.

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
            fire value: unless renewed within ttl, the server
            SETs fire key = fire value (waking its waiters)
PING   6    -                                                    -
==========  ===================================================  ==============================

``WAIT`` with timeout 0 is a non-blocking multi-get. A TIMEOUT response carries the same
fields as OK (what was present when time ran out).
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAGIC = b"XRUNKV1"
AUTH_CONTEXT = b"xrun-kv-auth"
NONCE_LEN = 16
DEFAULT_MAX_FRAME = 4 << 20
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
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


@dataclass(eq=False)
class _Waiter:
    keys: tuple[str, ...]
    want_all: bool
    future: asyncio.Future[None]


@dataclass(eq=False)
class _Lease:
    fire_key: str
    fire_value: bytes
    timer: asyncio.TimerHandle


@dataclass
class _ServerState:
    data: dict[str, bytes] = field(default_factory=dict)
    waiters: dict[str, list[_Waiter]] = field(default_factory=dict)
    leases: dict[str, _Lease] = field(default_factory=dict)


class StoreServer:
    """The store, served by an asyncio loop in a daemon thread.

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
    ) -> None:
        self._token = token
        self._max_frame = max_frame
        self._handshake_timeout = handshake_timeout
        self._state = _ServerState()
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
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name=f"xrun-store:{self.port}", daemon=True
        )
        self._thread.start()
        started.wait()

    # -- lifecycle ---------------------------------------------------------------------------

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def _start() -> None:
            self._server = await asyncio.start_server(
                self._on_connect, sock=self._sock, limit=self._max_frame + 64
            )

        self._loop.run_until_complete(_start())
        started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def stop(self) -> None:
        """Close every connection and the listening socket; idempotent."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return

        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            for t in list(self._conns):
                t.cancel()
            for lease in self._state.leases.values():
                lease.timer.cancel()
            self._state.leases.clear()
            await asyncio.sleep(0)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop)
        self._thread.join(timeout=5)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # -- data ops (all run on the loop thread) -------------------------------------------------

    def _set(self, key: str, value: bytes) -> None:
        st = self._state
        st.data[key] = value
        waiters = st.waiters.get(key)
        if not waiters:
            return
        keep: list[_Waiter] = []
        for w in waiters:
            if w.future.done():
                continue
            if not w.want_all or all(k in st.data for k in w.keys):
                w.future.set_result(None)
            else:
                keep.append(w)
        if keep:
            st.waiters[key] = keep
        else:
            del st.waiters[key]

    def _add(self, key: str, delta: int) -> int:
        old = self._state.data.get(key, b"0")
        try:
            new = int(old) + delta
        except ValueError:
            raise StoreError(
                f"ADD on key {key!r} whose value {old[:40]!r} is not an integer"
            ) from None
        self._set(key, str(new).encode())
        return new

    def _lease(self, key: str, ttl: float, fire_key: str, fire_value: bytes) -> None:
        st = self._state
        old = st.leases.pop(key, None)
        if old is not None:
            old.timer.cancel()
        if ttl <= 0:
            return

        def _fire() -> None:
            if st.leases.get(key) is lease:
                del st.leases[key]
                if fire_key not in st.data:
                    self._set(fire_key, fire_value)

        lease = _Lease(fire_key, fire_value, self._loop.call_later(ttl, _fire))
        st.leases[key] = lease

    def _present(self, keys: Sequence[str]) -> bytes:
        data = self._state.data
        parts = [_LEN.pack(len(keys))]
        for k in keys:
            v = data.get(k)
            if v is None:
                parts.append(b"\x00")
            else:
                parts.append(b"\x01" + _LEN.pack(len(v)) + v)
        return b"".join(parts)

    async def _wait(self, keys: tuple[str, ...], want_all: bool, timeout: float) -> bool:
        data = self._state.data
        if (all if want_all else any)(k in data for k in keys) or not keys:
            return True
        if timeout == 0:
            return False
        fut: asyncio.Future[None] = self._loop.create_future()
        w = _Waiter(keys, want_all, fut)
        for k in keys:
            self._state.waiters.setdefault(k, []).append(w)
        try:
            if timeout < 0:
                await fut
            else:
                await asyncio.wait_for(fut, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            # Unregister so abandoned waits do not accumulate on hot keys.
            for k in keys:
                lst = self._state.waiters.get(k)
                if lst is not None:
                    with contextlib.suppress(ValueError):
                        lst.remove(w)
                    if not lst:
                        del self._state.waiters[k]

    # -- connections ---------------------------------------------------------------------------

    async def _read_frame(self, reader: asyncio.StreamReader) -> bytes:
        (n,) = _LEN.unpack(await reader.readexactly(4))
        if n > self._max_frame:
            raise ProtocolError(f"frame of {n} bytes exceeds the {self._max_frame}-byte limit")
        return await reader.readexactly(n)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        nonce = os.urandom(NONCE_LEN)
        flags = 1 if self._token else 0
        writer.write(_pack_bytes(MAGIC + bytes([flags]) + nonce))
        await writer.drain()
        try:
            body = await asyncio.wait_for(self._read_frame(reader), self._handshake_timeout)
        except asyncio.TimeoutError:
            log.info("store: dropped a client that sent no handshake in %ss", self._handshake_timeout)
            return False
        if not body.startswith(MAGIC):
            return False
        mac = body[len(MAGIC) :]
        if self._token is not None and not hmac.compare_digest(mac, auth_mac(self._token, nonce)):
            writer.write(_pack_bytes(b"\x01wrong or missing token for this rendezvous store"))
            await writer.drain()
            return False
        writer.write(_pack_bytes(b"\x00"))
        return True

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        waits: set[asyncio.Task[None]] = set()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not await self._handshake(reader, writer):
                return
            while True:
                body = await self._read_frame(reader)
                await self._dispatch(body, writer, waits)
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, OSError) as e:
            log.debug("store: closing connection: %s", e)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug must cost one connection, never the server
            log.exception("store: unexpected error on a connection")
        finally:
            for t in waits:
                t.cancel()
            self._conns.discard(task)
            writer.close()

    async def _dispatch(
        self, body: bytes, writer: asyncio.StreamWriter, waits: set[asyncio.Task[None]]
    ) -> None:
        r = _Reader(body)
        rid = r.u32()
        op = r.u8()
        try:
            if op == Op.WAIT:
                want_all = r.u8() == 0
                timeout = r.f64()
                keys = tuple(r.str_() for _ in range(r.u32()))
                if len(waits) >= MAX_WAITS_PER_CONNECTION:
                    raise StoreError(f"more than {MAX_WAITS_PER_CONNECTION} waits on one connection")
                t = asyncio.ensure_future(self._wait_and_reply(rid, keys, want_all, timeout, writer))
                waits.add(t)
                t.add_done_callback(waits.discard)
                return
            payload = b""
            if op == Op.SET:
                key = r.str_()
                self._set(key, r.bytes_())
            elif op == Op.ADD:
                key = r.str_()
                payload = _I64.pack(self._add(key, r.i64()))
            elif op == Op.DELETE:
                self._state.data.pop(r.str_(), None)
            elif op == Op.LEASE:
                key = r.str_()
                ttl = r.f64()
                fire_key = r.str_()
                self._lease(key, ttl, fire_key, r.bytes_())
            elif op == Op.PING:
                pass
            else:
                raise ProtocolError(f"unknown op {op}")
        except StoreError as e:
            if isinstance(e, ProtocolError):
                raise
            self._reply(writer, rid, Status.ERROR, _pack_bytes(str(e).encode()))
        else:
            self._reply(writer, rid, Status.OK, payload)
        await writer.drain()

    def _reply(self, writer: asyncio.StreamWriter, rid: int, status: Status, payload: bytes) -> None:
        if rid == 0 or writer.is_closing():
            return
        writer.write(_LEN.pack(_HEAD.size + len(payload)) + _HEAD.pack(rid, status) + payload)

    async def _wait_and_reply(
        self,
        rid: int,
        keys: tuple[str, ...],
        want_all: bool,
        timeout: float,
        writer: asyncio.StreamWriter,
    ) -> None:
        ok = await self._wait(keys, want_all, timeout)
        self._reply(writer, rid, Status.OK if ok else Status.TIMEOUT, self._present(keys))
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()


# ---------------------------------------------------------------------------------------------
# Client


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the store closed the connection")
        buf += chunk
    return bytes(buf)


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


def lease_fields(key: str, ttl: float, fire_key: str, fire_value: bytes) -> bytes:
    return (
        _pack_bytes(key.encode())
        + _F64.pack(ttl)
        + _pack_bytes(fire_key.encode())
        + _pack_bytes(fire_value)
    )


class Connection:
    """One authenticated socket to the store; frames in, frames out. Not thread-safe by itself."""

    def __init__(self, sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.sock = sock
        self.max_frame = max_frame

    @classmethod
    def open(
        cls,
        host: str,
        port: int,
        token: bytes | None,
        *,
        deadline: float,
        read_timeout: float,
    ) -> Connection:
        """Connect, retrying with jittered exponential backoff until ``deadline`` (monotonic).

        Retrying covers the usual start-up race: agents on other hosts start before the one that
        serves the store. Authentication failures are not retried: they will not fix themselves.
        """
        delay = 0.02
        last: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                sock = socket.create_connection(
                    (host, port), timeout=max(0.05, min(read_timeout, remaining))
                )
            except OSError as e:
                last = e
                if time.monotonic() + delay >= deadline:
                    raise StoreTimeoutError(
                        f"could not reach the rendezvous store at {host}:{port}: {last}"
                    ) from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
                continue
            conn = cls(sock)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(read_timeout)
                conn._authenticate(token)
            except BaseException:
                sock.close()
                raise
            return conn

    def _authenticate(self, token: bytes | None) -> None:
        try:
            hello = self.recv_frame()
        except (ConnectionError, TimeoutError, OSError) as e:
            raise StoreError(f"the store did not greet us: {e}") from None
        if not hello.startswith(MAGIC) or len(hello) != len(MAGIC) + 1 + NONCE_LEN:
            raise ProtocolError(f"the peer is not an xrun store (greeting {hello[:16]!r})")
        needs_token = bool(hello[len(MAGIC)] & 1)
        nonce = hello[len(MAGIC) + 1 :]
        mac = auth_mac(token, nonce) if token is not None else b""
        self.send(_pack_bytes(MAGIC + mac))
        try:
            verdict = self.recv_frame()
        except ConnectionError:
            verdict = b"\x01connection closed during the handshake"
        if verdict != b"\x00":
            reason = verdict[1:].decode(errors="replace")
            hint = (
                "set XRUN_RDZV_TOKEN (or XRUN_RDZV_TOKEN_FILE, or rdzv conf token_file) to the job's secret"
                if needs_token
                else "check that the endpoint belongs to this job"
            )
            raise StoreAuthError(f"the store refused us: {reason}; {hint}")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        (n,) = _LEN.unpack(_recv_exact(self.sock, 4))
        if n > self.max_frame:
            raise ProtocolError(f"frame of {n} bytes exceeds the {self.max_frame}-byte limit")
        return _recv_exact(self.sock, n)

    def recv_response(self) -> Response:
        r = _Reader(self.recv_frame())
        rid = r.u32()
        return Response(rid, Status(r.u8()), r)

    def readable(self) -> bool:
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
    ) -> None:
        self.host, self.port = host, port
        self.read_timeout = read_timeout
        self._conn = Connection.open(
            host, port, token, deadline=time.monotonic() + connect_timeout, read_timeout=read_timeout
        )
        self._lock = threading.Lock()
        self._next_id = 1

    def _call(self, op: Op, *fields: bytes, timeout: float | None = None) -> Response:
        with self._lock:
            rid = self._next_id
            self._next_id = rid + 1 if rid < 0xFFFFFFFF else 1
            sock = self._conn.sock
            # A server-side wait may legitimately take `timeout`; read_timeout bounds the rest.
            sock.settimeout(None if timeout is None else timeout + self.read_timeout)
            try:
                self._conn.send(encode_request(rid, op, *fields))
                resp = self._conn.recv_response()
            except TimeoutError:
                raise StoreTimeoutError(
                    f"the store at {self.host}:{self.port} did not answer within "
                    f"{self.read_timeout}s (read_timeout)"
                ) from None
            except (ConnectionError, OSError) as e:
                raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None
        if resp.rid != rid:
            raise ProtocolError(f"response id {resp.rid} does not match request {rid}")
        if resp.status == Status.ERROR:
            raise StoreError(resp.body.str_())
        return resp

    def set(self, key: str, value: bytes) -> None:
        self._call(Op.SET, _pack_bytes(key.encode()), _pack_bytes(value))

    def add(self, key: str, delta: int) -> int:
        return self._call(Op.ADD, _pack_bytes(key.encode()), _I64.pack(delta)).body.i64()

    def delete(self, key: str) -> None:
        self._call(Op.DELETE, _pack_bytes(key.encode()))

    def ping(self) -> None:
        self._call(Op.PING)

    def lease(self, key: str, ttl: float, fire_key: str, fire_value: bytes) -> None:
        self._call(Op.LEASE, lease_fields(key, ttl, fire_key, fire_value))

    def get(self, key: str) -> bytes | None:
        """The value, or None when absent (non-blocking)."""
        return self.multi_get([key])[0]

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return self._call(Op.WAIT, wait_fields(keys, True, 0)).values()

    def wait(
        self, keys: Sequence[str], *, want_all: bool = True, timeout: float | None = None
    ) -> list[bytes | None] | None:
        """Block (on the server) until all/any of ``keys`` exist; their values, or None on timeout."""
        resp = self._call(Op.WAIT, wait_fields(keys, want_all, timeout), timeout=timeout)
        values = resp.values()
        return None if resp.status == Status.TIMEOUT else values

    def close(self) -> None:
        self._conn.close()
