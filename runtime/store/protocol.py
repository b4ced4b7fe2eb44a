"""xrun's store wire protocol (version 2): frames, ops, statuses, the encoders and the reader.

Both sides use this module: the server's session (``session.py``) decodes requests and encodes
answers, the client (``client.py``) the other way round. Nothing here touches a socket.

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
from collections.abc import Sequence

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
        return int(LEN.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(I64.unpack(self._take(8))[0])

    def f64(self) -> float:
        return float(F64.unpack(self._take(8))[0])

    def bytes_(self) -> bytes:
        return self._take(self.u32())

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


def wait_fields(keys: Sequence[str], want_all: bool, timeout: float | None) -> bytes:
    t = -1.0 if timeout is None else max(0.0, timeout)
    head = bytes([0 if want_all else 1]) + F64.pack(t) + LEN.pack(len(keys))
    return head + b"".join(pack_bytes(k.encode()) for k in keys)


def add_fields(key: str, delta: int) -> bytes:
    return pack_bytes(key.encode()) + I64.pack(delta)


def lease_fields(
    key: str, ttl: float, fire_key: str, fire_value: bytes, fire_on_disconnect: bool = False
) -> bytes:
    return (
        pack_bytes(key.encode())
        + F64.pack(ttl)
        + pack_bytes(fire_key.encode())
        + pack_bytes(fire_value)
        + bytes([1 if fire_on_disconnect else 0])
    )


# -- answers (server side) ----------------------------------------------------------------------


def encode_response(rid: int, status: Status, payload: bytes = b"") -> bytes:
    return LEN.pack(HEAD.size + len(payload)) + HEAD.pack(rid, status) + payload


def encode_values(values: Sequence[bytes | None]) -> bytes:
    """A WAIT answer's fields for ``values`` (None = absent); ``Reader.values`` reads them."""
    parts = [LEN.pack(len(values))]
    for v in values:
        parts.append(b"\x00" if v is None else b"\x01" + LEN.pack(len(v)) + v)
    return b"".join(parts)
