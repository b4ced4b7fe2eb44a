"""The store's client side: ``Connection`` (one authenticated socket, frames in and out) and
``StoreClient`` (blocking, thread-safe request/answer calls on one connection).

The rendezvous uses both: ``StoreClient`` for its calls, a raw ``Connection`` for the round
watch and the heartbeats it sends without waiting for answers. Standard library only.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Sequence

from xrun.record import Value

from .errors import (
    ProtocolError,
    StoreAuthError,
    StoreError,
    StoreHandshakeError,
    StoreTimeoutError,
)
from .protocol import (
    DEFAULT_MAX_FRAME,
    HELLO,
    LEN,
    MAGIC,
    NONCE_LEN,
    Op,
    Reader,
    Status,
    add_fields,
    auth_mac,
    encode_request,
    lease_fields,
    pack_bytes,
    request_fields,
    wait_fields,
)

__all__ = ["Connection", "Response", "StoreClient", "is_ip_literal"]


class Response(Value):
    """One answer: its request id, its status and a reader over its fields. A plain value
    class: a dataclass costs the agent's start-up (benchmark 1) ~0.9 ms to make."""

    rid: int
    status: Status
    body: Reader

    def values(self) -> list[bytes | None]:
        """Decode a WAIT response: one entry per requested key (None = absent)."""
        return self.body.values()


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

    def __init__(
        self, sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME, read_timeout: float = 60.0
    ) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self.read_timeout = read_timeout
        self._rbuf = bytearray()
        self._pending: list[bytes] = []  # queued frames, sent with the next send()
        # When the answer being read is overdue (None: never). The socket keeps its timeout
        # (read_timeout, set once at connect) rather than one per request: settimeout is a
        # system call, and every deadline is at least read_timeout away when a read starts, so
        # only a read that outlasts one timeout re-aims it at the deadline (see _fill). A short
        # "tick" instead would wake every waiting client every tick: with 16,384 agents parked
        # on the store that alone is tens of thousands of wake-ups a second.
        self.deadline: float | None = None
        self._timeout = sock.gettimeout()
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

        Retrying covers the usual start-up race (agents on other hosts start before the one that
        serves the store) and a store too busy to finish our handshake in time (thousands of
        agents arriving at once). Authentication failures are not retried: they will not fix
        themselves.
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
                delay = cls._backoff(
                    delay, deadline, f"could not reach the rendezvous store at {host}:{port}: {e}"
                )
                continue
            conn = cls(sock, read_timeout=read_timeout)
            try:
                conn.deadline = time.monotonic() + read_timeout
                conn._authenticate(token, lazy_verdict)
                conn.deadline = None
            except StoreHandshakeError as e:
                sock.close()
                delay = cls._backoff(delay, deadline, f"the rendezvous store at {host}:{port}: {e}")
                continue
            except BaseException:
                sock.close()
                raise
            return conn

    @staticmethod
    def _backoff(delay: float, deadline: float, why: str) -> float:
        """Sleep ``delay`` (jittered) before the next try, or raise StoreTimeoutError(``why``)
        when that would pass ``deadline``; the next delay."""
        if time.monotonic() + delay >= deadline:
            raise StoreTimeoutError(why)
        # benchmark 1: retries only (random pulls hashlib); a store that is up answers the first try
        import random

        time.sleep(delay * (0.5 + random.random()))
        return min(delay * 2, 1.0)

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
        if read_timeout != timeout:
            sock.settimeout(read_timeout)
        return sock

    def _authenticate(self, token: bytes | None, lazy_verdict: bool = False) -> None:
        try:
            self.sock.sendall(HELLO)
            hello = self.recv_frame()
        except (ConnectionError, TimeoutError, OSError) as e:
            raise StoreHandshakeError(f"it did not greet us: {e}") from None
        if not hello.startswith(MAGIC) or len(hello) != len(MAGIC) + 1 + NONCE_LEN:
            raise ProtocolError(f"the peer is not an xrun store (greeting {hello[:16]!r})")
        self._needs_token = bool(hello[len(MAGIC)] & 1)
        nonce = hello[len(MAGIC) + 1 :]
        mac = auth_mac(token, nonce) if token is not None else b""
        self.queue(pack_bytes(MAGIC + mac))
        self._verdict_pending = True
        if not lazy_verdict:
            self.send(b"")
            self._read_verdict()

    @property
    def verdict_pending(self) -> bool:
        """Our credentials are sent (or queued) and the store's verdict is not read yet."""
        return self._verdict_pending

    def _read_verdict(self) -> None:
        self._verdict_pending = False
        try:
            verdict = self.recv_frame()
        except ConnectionError:
            raise StoreHandshakeError(
                "it closed the connection before it answered our handshake"
            ) from None
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
                self._reaim()
                continue
            if not chunk:
                raise ConnectionError("the store closed the connection")
            buf += chunk

    def _reaim(self) -> None:
        """A read timed out: raise if its deadline passed, else wait again until it (or for
        another read_timeout when there is none)."""
        tick = self.read_timeout
        if self.deadline is None:
            timeout = tick
        else:
            timeout = min(tick, self.deadline - time.monotonic())
            if timeout <= 0:
                raise TimeoutError("the store did not answer in time")
        if timeout != self._timeout:
            self.sock.settimeout(max(0.01, timeout))
            self._timeout = timeout

    def recv_frame(self) -> bytes:
        self._fill(4)
        (n,) = LEN.unpack_from(self._rbuf)
        if n > self.max_frame:
            raise ProtocolError(f"frame of {n} bytes exceeds the {self.max_frame}-byte limit")
        self._fill(4 + n)
        frame = bytes(self._rbuf[4 : 4 + n])
        del self._rbuf[: 4 + n]
        return frame

    def recv_response(self) -> Response:
        if self._verdict_pending:
            self._read_verdict()
        r = Reader(self.recv_frame())
        rid = r.u32()
        return Response(rid, Status(r.u8()), r)

    def readable(self) -> bool:
        """A frame (or EOF) can be read without blocking."""
        if len(self._rbuf) >= 4 and len(self._rbuf) >= 4 + LEN.unpack_from(self._rbuf)[0]:
            return True
        return bool(select.select([self.sock], [], [], 0)[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class StoreClient:
    """A blocking, thread-safe client on one connection.

    Calls (``pipeline`` and the methods built on it) may overlap with requests whose answers
    are read later (``submit``/``poll``: a WAIT parked on the server, e.g. the rendezvous'
    round watch) and with fire-and-forget requests (``post``/``post_now``, e.g. heartbeats):
    writes take one short lock, reads another, and an answer that arrives for a submitted
    request while a call reads is kept for its ``poll``. So one agent needs one connection.
    Calls from several threads may overlap too (the agent's ``kv()`` connection: the watch
    loop's WAIT for the other nodes' stacks and the stall watchdog's ADD from its thread): the
    call that reads keeps the others' answers for them, and each waits for the reader to
    finish (a call behind a long server-side wait waits with it).
    """

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
        self._token = token
        self._connect_deadline = time.monotonic() + connect_timeout
        self._lazy = lazy_verdict
        self._conn = self._open()
        # Nothing sent yet but the handshake: with a lazy verdict, a store that drops us before
        # it answers it has applied nothing, and the first call may connect again and resend.
        self._fresh = True
        self._wlock = threading.Lock()  # request ids and writes
        self._rlock = threading.Lock()  # reads
        self._next_id = 1
        # Submitted requests whose answers a poll() will want; their answers, once read.
        self._submitted: set[int] = set()
        self._answers: dict[int, Response] = {}
        # Requests of calls in progress (any thread's): the reading call keeps their answers.
        self._calling: set[int] = set()

    def _open(self) -> Connection:
        return Connection.open(
            self.host,
            self.port,
            self._token,
            deadline=self._connect_deadline,
            read_timeout=self.read_timeout,
            lazy_verdict=self._lazy,
        )

    def _ids(self, n: int) -> list[int]:
        """``n`` fresh request ids (never 0: that is fire-and-forget); caller holds _wlock."""
        first = self._next_id
        rids = [(first + k - 1) % 0xFFFFFFFF + 1 for k in range(n)]
        self._next_id = rids[-1] % 0xFFFFFFFF + 1
        return rids

    def _call(self, op: Op, *fields: bytes, wait: float | None = 0.0) -> Response:
        return self.pipeline([(op, fields)], wait=wait)[0]

    def pipeline(
        self, calls: Sequence[tuple[Op, tuple[bytes, ...]]], *, wait: float | None = 0.0
    ) -> list[Response]:
        """Send several requests at once and read their answers in order (one round trip).

        ``wait`` is the longest server-side wait among them (None: unbounded); the answers are
        overdue ``read_timeout`` seconds after that.
        """
        fresh, self._fresh = self._fresh, False
        try:
            return self._pipeline(calls, wait)
        except StoreHandshakeError as e:
            if not fresh:
                raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None
        # The store dropped us before it checked our credentials (too busy to finish the
        # handshake in time): it applied nothing of ours. Connect again (until the connect
        # deadline) and send the same requests.
        self._conn.close()
        self._conn = self._open()
        return self._pipeline(calls, wait)

    def _pipeline(
        self, calls: Sequence[tuple[Op, tuple[bytes, ...]]], wait: float | None
    ) -> list[Response]:
        rids: list[int] = []
        try:
            with self._wlock:
                rids = self._ids(len(calls))
                self._calling.update(rids)
                self._conn.send(
                    b"".join(
                        encode_request(rid, op, *f)
                        for rid, (op, f) in zip(rids, calls, strict=True)
                    )
                )
            with self._rlock:
                # A parked wait may legitimately take `wait`; read_timeout bounds the rest.
                self._conn.deadline = (
                    None if wait is None else time.monotonic() + wait + self.read_timeout
                )
                # Answers to parked waits may overtake earlier ones: match them by id. Another
                # thread's call may have read ours while we waited for the lock.
                by_id = {rid: self._answers.pop(rid) for rid in rids if rid in self._answers}
                while len(by_id) < len(rids):
                    resp = self._conn.recv_response()
                    if resp.rid in rids:
                        by_id[resp.rid] = resp
                    elif resp.rid in self._submitted or resp.rid in self._calling:
                        self._answers[resp.rid] = resp
                    else:
                        raise ProtocolError(f"response id {resp.rid} matches no request in {rids}")
                resps = [by_id[rid] for rid in rids]
        except TimeoutError:
            raise StoreTimeoutError(
                f"the store at {self.host}:{self.port} did not answer within "
                f"{self.read_timeout}s (read_timeout)"
            ) from None
        except StoreError:
            raise
        except (ConnectionError, OSError) as e:
            if self._conn.verdict_pending:  # dropped before it answered our handshake
                raise StoreHandshakeError(str(e)) from None
            raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None
        finally:
            self._calling.difference_update(rids)
            for rid in rids:  # read by another call after ours failed: nobody wants it now
                self._answers.pop(rid, None)
        for resp in resps:
            if resp.status == Status.ERROR:
                raise StoreError(resp.body.str_())
        return resps

    def submit(self, op: Op, *fields: bytes, queue: bool = False) -> int:
        """Send a request (now, or with the next call when ``queue``) and return its id;
        ``poll(id)`` reads its answer later."""
        self._fresh = False
        try:
            with self._wlock:
                (rid,) = self._ids(1)
                self._submitted.add(rid)
                if queue:
                    self._conn.queue(encode_request(rid, op, *fields))
                else:
                    self._conn.send(encode_request(rid, op, *fields))
        except (ConnectionError, OSError) as e:
            raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None
        return rid

    def forget(self, rid: int) -> None:
        """The answer to submitted request ``rid`` is no longer wanted."""
        self._submitted.discard(rid)
        self._answers.pop(rid, None)

    def poll(self, rid: int) -> Response | None:
        """The answer to submitted request ``rid`` if it has arrived, else None; never waits
        for one (``fileno()`` turns readable when an answer arrives)."""
        if rid in self._answers:
            self._submitted.discard(rid)
            return self._answers.pop(rid)
        if not self._rlock.acquire(blocking=False):
            return None  # a call is reading: it keeps our answer for us
        try:
            self._conn.deadline = time.monotonic() + self.read_timeout
            while self._conn.readable():
                resp = self._conn.recv_response()
                if resp.rid == rid:
                    self._submitted.discard(rid)
                    return resp
                if resp.rid in self._submitted or resp.rid in self._calling:
                    self._answers[resp.rid] = resp
        except TimeoutError:
            raise StoreTimeoutError(
                f"the store at {self.host}:{self.port} sent half an answer"
            ) from None
        except (ConnectionError, OSError) as e:
            raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None
        finally:
            self._rlock.release()
        return None

    def answered(self, rid: int) -> bool:
        """The answer to submitted request ``rid`` was read (by a call) and awaits ``poll``:
        the socket will not turn readable for it."""
        return rid in self._answers

    def fileno(self) -> int:
        """The connection's socket: readable when an answer (or EOF) arrives."""
        return self._conn.sock.fileno()

    def set(self, key: str, value: bytes) -> None:
        self._call(Op.SET, request_fields(Op.SET, key, value))

    def post(self, op: Op, *fields: bytes) -> None:
        """Queue a request that gets no answer (request id 0); it leaves with the next call.

        The server handles one connection's requests in order, so that next call already sees
        its effect; an error in it closes the connection and surfaces on that call.
        """
        self._fresh = False
        with self._wlock:
            self._conn.queue(encode_request(0, op, *fields))

    def post_now(self, *frames: tuple[Op, bytes]) -> None:
        """Send requests that get no answer now (with whatever ``post`` queued): heartbeats,
        which must not wait behind a call blocked on a long server-side wait."""
        self._fresh = False
        try:
            with self._wlock:
                self._conn.send(b"".join(encode_request(0, op, f) for op, f in frames))
        except (ConnectionError, OSError) as e:
            raise StoreError(f"lost the store at {self.host}:{self.port}: {e}") from None

    def post_set(self, key: str, value: bytes) -> None:
        self.post(Op.SET, request_fields(Op.SET, key, value))

    def add(self, key: str, delta: int) -> int:
        return self._call(Op.ADD, add_fields(key, delta)).body.i64()

    def delete(self, key: str) -> None:
        self._call(Op.DELETE, request_fields(Op.DELETE, key))

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

    def abort(self) -> None:
        """Close from another thread: a call blocked reading an answer wakes (and fails) now;
        ``close`` alone leaves it blocked until ``read_timeout``."""
        with contextlib.suppress(OSError):
            self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()
