"""xrun's store wire protocol (version 2): frames, ops, statuses, the encoders and the parsers.

Both sides use this module: the server's handler (``handler.py``) reads a client's stream with
:class:`RequestParser` (typed request values, as ``torch_protocol.RequestParser`` does for
torch's protocol) and encodes answers; the client (``client.py``) the other way round. Nothing
here touches a socket.

Everything travels in *frames*: a 4-byte big-endian unsigned length ``N`` then ``N`` bytes.
A frame longer than the server's ``max_frame`` (default 4 MiB) closes the connection.

Handshake (before any request). The client speaks first: the server serves torch's TCPStore
protocol on the same port (``torch_protocol.py``), and a torch client speaks first too, so the
server tells the two apart by a connection's first bytes (``server.py``); a torch client's are
``00 ce f7 85 3c``, never ``X``.

0. client -> server: ``b"XRUNKV2"`` (unframed: ``HELLO``)
1. server -> client: ``b"XRUNKV2"`` + flags (1 byte, bit 0 = a token is required) + 16-byte nonce
2. client -> server: ``b"XRUNKV2"`` + MAC, where MAC = HMAC-SHA256(token, ``b"xrun-kv-auth"`` +
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
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import ProtocolError

MAGIC = b"XRUNKV2"
# What an xrun client sends first (step 0): unframed, so its first byte is "X".
HELLO = MAGIC
AUTH_CONTEXT = b"xrun-kv-auth"
NONCE_LEN = 16
DEFAULT_MAX_FRAME = 4 << 20
# Before it proves the token, a client may send no frame longer than this.
MAX_HANDSHAKE_FRAME = 256

LEN = struct.Struct("!I")
HEAD = struct.Struct("!IB")
I64 = struct.Struct("!q")
F64 = struct.Struct("!d")


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


def pack_bytes(b: bytes) -> bytes:
    """A ``str``/``bytes`` field: its length, then the bytes."""
    return LEN.pack(len(b)) + b


class Reader:
    """Sequential decoder over one frame body; raises ProtocolError on truncation.

    Each field is read with one ``unpack_from`` and no helper call: the store decodes every
    field of every request with it (benchmark 11)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def _short(self, n: int, at: int) -> ProtocolError:
        return ProtocolError(f"truncated frame: wanted {n} bytes at offset {at}")

    def u8(self) -> int:
        pos = self.pos
        if pos >= len(self.buf):
            raise self._short(1, pos)
        self.pos = pos + 1
        return self.buf[pos]

    def _fixed(self, fmt: struct.Struct) -> Any:
        pos = self.pos
        try:
            (value,) = fmt.unpack_from(self.buf, pos)
        except struct.error:
            raise self._short(fmt.size, pos) from None
        self.pos = pos + fmt.size
        return value

    def u32(self) -> int:
        pos = self.pos
        try:
            (value,) = LEN.unpack_from(self.buf, pos)
        except struct.error:
            raise self._short(4, pos) from None
        self.pos = pos + 4
        return int(value)

    def i64(self) -> int:
        return int(self._fixed(I64))

    def f64(self) -> float:
        return float(self._fixed(F64))

    def bytes_(self) -> bytes:
        buf, pos = self.buf, self.pos
        try:
            (n,) = LEN.unpack_from(buf, pos)
        except struct.error:
            raise self._short(4, pos) from None
        start = pos + 4
        end = start + n
        if end > len(buf):
            raise self._short(n, start)
        self.pos = end
        return buf[start:end]

    def str_(self) -> str:
        try:
            return self.bytes_().decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"key is not UTF-8: {e}") from None

    def values(self) -> list[bytes | None]:
        """A WAIT answer's fields: one entry per requested key (None = absent)."""
        out: list[bytes | None] = []
        for _ in range(self.u32()):
            out.append(self.bytes_() if self.u8() else None)
        return out


def auth_mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, AUTH_CONTEXT + nonce, hashlib.sha256).digest()


def greeting(token_required: bool, nonce: bytes) -> bytes:
    """Handshake step 1, framed."""
    return pack_bytes(MAGIC + bytes([1 if token_required else 0]) + nonce)


# -- requests (client side) ---------------------------------------------------------------------


def encode_request(rid: int, op: Op, *fields: bytes) -> bytes:
    body = HEAD.pack(rid, op) + b"".join(fields)
    return LEN.pack(len(body)) + body


def request_fields(op: Op, *values: Any) -> bytes:
    """The fields of an ``op`` request, as its layout (``LAYOUTS``) writes ``values``."""
    return b"".join(field.write(v) for field, v in zip(LAYOUTS[op][1], values, strict=True))


def wait_fields(keys: Sequence[str], want_all: bool, timeout: float | None) -> bytes:
    t = -1.0 if timeout is None else max(0.0, timeout)
    return request_fields(Op.WAIT, want_all, t, keys)


def add_fields(key: str, delta: int) -> bytes:
    return request_fields(Op.ADD, key, delta)


def lease_fields(
    key: str, ttl: float, fire_key: str, fire_value: bytes, fire_on_disconnect: bool = False
) -> bytes:
    return request_fields(Op.LEASE, key, ttl, fire_key, fire_value, fire_on_disconnect)


# -- answers (server side) ----------------------------------------------------------------------


def encode_response(rid: int, status: Status, payload: bytes = b"") -> bytes:
    return LEN.pack(HEAD.size + len(payload)) + HEAD.pack(rid, status) + payload


def encode_values(values: Sequence[bytes | None]) -> bytes:
    """A WAIT answer's fields for ``values`` (None = absent); ``Reader.values`` reads them."""
    parts = [LEN.pack(len(values))]
    for v in values:
        parts.append(b"\x00" if v is None else b"\x01" + LEN.pack(len(v)) + v)
    return b"".join(parts)


# -- requests, decoded (server side) ------------------------------------------------------------
# Plain classes with __slots__: the client imports this module on every agent's start-up, and a
# NamedTuple class costs far more to create than these.


class Hello:
    """Handshake step 0 (``HELLO``, unframed): the server answers with its greeting."""

    __slots__ = ()


class Credentials:
    """Handshake step 2: the client's MAC (empty: it has no token)."""

    __slots__ = ("mac",)

    def __init__(self, mac: bytes) -> None:
        self.mac = mac


class Request:
    """A request after the handshake; ``rid`` 0 wants no answer."""

    __slots__ = ("rid",)

    def __init__(self, rid: int) -> None:
        self.rid = rid


class Set(Request):
    __slots__ = ("key", "value")

    def __init__(self, rid: int, key: str, value: bytes) -> None:
        self.rid, self.key, self.value = rid, key, value


class Add(Request):
    __slots__ = ("key", "delta")

    def __init__(self, rid: int, key: str, delta: int) -> None:
        self.rid, self.key, self.delta = rid, key, delta


class Wait(Request):
    """``timeout`` < 0: for ever; 0: a non-blocking multi-get."""

    __slots__ = ("want_all", "timeout", "keys")

    def __init__(self, rid: int, want_all: bool, timeout: float, keys: tuple[str, ...]) -> None:
        self.rid, self.want_all, self.timeout, self.keys = rid, want_all, timeout, keys


class Delete(Request):
    __slots__ = ("key",)

    def __init__(self, rid: int, key: str) -> None:
        self.rid, self.key = rid, key


class Lease(Request):
    """``owned``: flags bit 0, the lease fires when this connection closes."""

    __slots__ = ("key", "ttl", "fire_key", "fire_value", "owned")

    def __init__(  # noqa: PLR0913 - one parameter per wire field
        self, rid: int, key: str, ttl: float, fire_key: str, fire_value: bytes, owned: bool
    ) -> None:
        self.rid, self.key, self.ttl = rid, key, ttl
        self.fire_key, self.fire_value, self.owned = fire_key, fire_value, owned


class Ping(Request):
    __slots__ = ()


Message = Hello | Credentials | Request


# -- one layout per request, shared by the client's encoder and the server's decoder -------------
# (as h11's READERS/WRITERS and torch_protocol._LAYOUTS): each field kind reads and writes itself.


class _Field:
    """One kind of wire field: how ``Reader`` reads it and how a value is written."""

    __slots__ = ("read", "write")

    def __init__(self, read: Callable[[Reader], Any], write: Callable[[Any], bytes]) -> None:
        self.read, self.write = read, write


def _read_keys(r: Reader) -> tuple[str, ...]:
    return tuple(r.str_() for _ in range(r.u32()))


def _write_keys(keys: Sequence[str]) -> bytes:
    return LEN.pack(len(keys)) + b"".join(pack_bytes(k.encode()) for k in keys)


STR = _Field(Reader.str_, lambda v: pack_bytes(v.encode()))  # keys are UTF-8
BYTES = _Field(Reader.bytes_, pack_bytes)
I64_ = _Field(Reader.i64, I64.pack)
F64_ = _Field(Reader.f64, F64.pack)
KEYS = _Field(_read_keys, _write_keys)  # count:u32, then that many STR
WANT_ALL = _Field(lambda r: r.u8() == 0, lambda v: bytes([0 if v else 1]))  # mode: 0 all, 1 any
FLAG = _Field(lambda r: bool(r.u8() & 1), lambda v: bytes([1 if v else 0]))  # flags bit 0

# op -> (its request type, its fields after the head, in wire order; the type's fields after rid)
LAYOUTS: dict[Op, tuple[Callable[..., Request], tuple[_Field, ...]]] = {
    Op.SET: (Set, (STR, BYTES)),
    Op.ADD: (Add, (STR, I64_)),
    Op.WAIT: (Wait, (WANT_ALL, F64_, KEYS)),
    Op.DELETE: (Delete, (STR,)),
    Op.LEASE: (Lease, (STR, F64_, STR, BYTES, FLAG)),
    Op.PING: (Ping, ()),
}
# by the op's byte: decode_request looks up what it read off the wire
_BY_BYTE: dict[int, tuple[Callable[..., Request], tuple[Callable[[Reader], Any], ...]]] = {
    int(op): (cls, tuple(f.read for f in fields)) for op, (cls, fields) in LAYOUTS.items()
}


def decode_request(body: bytes) -> Request:
    """One request frame's body as a value; ProtocolError for an unknown op or a short frame."""
    try:
        rid, op = HEAD.unpack_from(body)
    except struct.error:
        raise ProtocolError(f"truncated frame: {len(body)} bytes, no request head") from None
    layout = _BY_BYTE.get(op)
    if layout is None:
        raise ProtocolError(f"unknown op {op}")
    cls, readers = layout
    r = Reader(body, HEAD.size)
    return cls(rid, *[read(r) for read in readers])


class RequestParser:
    """Incremental parser of one client's stream (server side): ``feed(data)``, then iterate for
    what it completes: ``Hello``, ``Credentials``, then ``Request`` values.

    Framing limits: before its credentials a client may send no frame over
    ``MAX_HANDSHAKE_FRAME`` bytes (no room to make the server buffer much), after them none over
    ``max_frame``; a length over the limit is a ProtocolError before any of its bytes is awaited.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0
        self._stage = 0  # 0: HELLO next, 1: credentials next, 2: requests

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[Message]:
        buf = self._buf
        if self._stage == 0:
            if len(buf) < len(HELLO):
                return
            if buf[: len(HELLO)] != HELLO:
                raise ProtocolError("bad handshake")
            self._pos, self._stage = len(HELLO), 1
            yield Hello()
        # One loop, no helper call per frame: every request of every agent passes here.
        while len(buf) - (pos := self._pos) >= 4:
            (n,) = LEN.unpack_from(buf, pos)
            if self._stage < 2 and n > MAX_HANDSHAKE_FRAME:
                raise ProtocolError(f"handshake frame of {n} bytes")
            if n > self.max_frame:
                raise ProtocolError(f"frame of {n} bytes exceeds the {self.max_frame}-byte limit")
            end = pos + 4 + n
            if len(buf) < end:
                return
            self._pos = end
            frame = bytes(buf[pos + 4 : end])
            if self._stage == 2:
                yield decode_request(frame)
            elif not frame.startswith(MAGIC):
                raise ProtocolError("bad handshake")
            else:
                self._stage = 2
                yield Credentials(frame[len(MAGIC) :])


def encode_verdict(reason: str | None) -> bytes:
    """Handshake step 3, framed: accepted (None), or refused for ``reason``."""
    return pack_bytes(b"\x00" if reason is None else b"\x01" + reason.encode())
