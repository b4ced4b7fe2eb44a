"""Bytes <-> typed values for torch's TCPStore wire protocol (what torch 2.13's client sends).

The server side reads with :class:`RequestParser`: feed it bytes as they arrive on one
connection and iterate over it for the requests completed so far, as immutable values (one class
per query type). It never blocks, never raises on a request that is merely incomplete, and keeps its
state between calls, so a request split anywhere (torch's client flushes every 1,440 bytes)
costs the same as one that arrives whole. Input that cannot be torch's protocol raises
:class:`ProtocolError`, which the caller turns into "drop this connection" - what torch's own
servers do. Every declared length is checked against :class:`Limits` *before* any byte of it is
awaited, so a huge length is an error, never an allocation.

The response encoders (``encode_*``) build what the server sends back; :func:`encode_request`
builds what a client sends (tests and tools use it; the layout table is shared, so the two
directions cannot disagree). docs/torch-tcpstore-protocol.md describes the protocol.

Wire format in short: a request is one query-type byte and then its fields; integers are
little-endian (torch copies them from memory, and every platform it ships for is little-endian);
a string or byte vector is a u64 length and then its bytes; a key list is a u64 count and then
that many strings. A connection's first request must be VALIDATE with the magic number.

Standard library only.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

from xrun.record import Value

# The store's one ProtocolError (re-exported: the peer sent something torch's protocol does not
# allow), so the connection that drives either protocol's handler drops a client on one type.
from .errors import ProtocolError

VALIDATION_MAGIC: Final = 0x3C85F7CE

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")

# What a torch client sends first: VALIDATE and the magic number (5 bytes).
HANDSHAKE_PREFIX: Final = bytes([0]) + _U32.pack(VALIDATION_MAGIC)


class QueryType(enum.IntEnum):
    """The request's first byte (torch's ``c10d::detail::QueryType``, in its order)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


class CheckResponse(enum.IntEnum):
    READY = 0
    NOT_READY = 1


class WaitResponse(enum.IntEnum):
    STOP_WAITING = 0
    WAIT_CANCELED = 1


class Limits(NamedTuple):
    """Upper bounds on what one request may declare; anything larger is a ProtocolError.

    torch's libuv server allows keys of 8 KiB, values of 8 MiB and 128 Ki keys per request; the
    defaults here are looser (a client that works with torch's server works here) but still
    finite, and ``max_request_bytes`` caps what one connection can make the server buffer.
    """

    max_key_bytes: int = 64 << 10
    max_value_bytes: int = 64 << 20
    max_keys: int = 128 << 10
    max_request_bytes: int = 128 << 20


DEFAULT_LIMITS: Final = Limits()


# --- requests ---------------------------------------------------------------------------------
# Keys are str: torch sends them as raw bytes, decoded here as UTF-8 with surrogateescape, so a
# key that is not UTF-8 still round-trips exactly (encode_request and the key space see the same
# bytes back).


class _Request(Value):
    """A request value (:class:`xrun.record.Value`): immutable, equal to another of its type
    with equal fields, each field written once as an annotation. Not dataclasses: nineteen
    frozen dataclasses cost ~12 ms to import, on the path of the store's first torch
    connection."""

    __slots__ = ()

    def fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)


class Validate(_Request):
    """The handshake: no answer. Only valid as a connection's first request."""


# Writes.


class Set(_Request):
    key: str
    value: bytes


class Append(_Request):
    key: str
    value: bytes


class Add(_Request):
    key: str
    delta: int


class DeleteKey(_Request):
    key: str


class CompareSet(_Request):
    key: str
    expected: bytes
    desired: bytes


class MultiSet(_Request):
    keys: tuple[str, ...]
    values: tuple[bytes, ...]


# Reads.


class Ping(_Request):
    nonce: int


class ListKeys(_Request): ...


class Check(_Request):
    keys: tuple[str, ...]


class GetNumKeys(_Request): ...


class MultiGet(_Request):
    keys: tuple[str, ...]


class Get(_Request):
    key: str


# Waits (answered when the keys are there, or the client cancels).


class Wait(_Request):
    keys: tuple[str, ...]


class Barrier(_Request):
    key: str
    world_size: int


class CancelWait(_Request): ...


# Queues.


class QueueLen(_Request):
    key: str


class QueuePop(_Request):
    key: str


class QueuePush(_Request):
    key: str
    value: bytes


Request = (
    Validate
    | Ping
    | Set
    | CompareSet
    | Get
    | Add
    | Check
    | Wait
    | GetNumKeys
    | DeleteKey
    | Append
    | MultiGet
    | MultiSet
    | CancelWait
    | QueuePush
    | QueuePop
    | QueueLen
    | ListKeys
    | Barrier
)


# --- layouts: the fields after the query byte, shared by the parser and encode_request ---------


class _F(enum.Enum):
    KEY = "key"  # u64 length + bytes, decoded to str
    BYTES = "bytes"  # u64 length + bytes
    U32 = "u32"
    I64 = "i64"
    KEYS = "keys"  # u64 count + that many KEYs
    PAIRS = "pairs"  # u64 count + that many (KEY, BYTES)


def _multi_set(pairs: tuple[Any, ...]) -> MultiSet:
    return MultiSet(tuple(pairs[0::2]), tuple(pairs[1::2]))


# query -> (its fields after the query byte, its request type, how fields become a request)
_LAYOUTS: Final[dict[QueryType, tuple[tuple[_F, ...], type, Callable[..., Request]]]] = {
    QueryType.VALIDATE: ((_F.U32,), Validate, lambda _magic: Validate()),
    QueryType.SET: ((_F.KEY, _F.BYTES), Set, Set),
    QueryType.COMPARE_SET: ((_F.KEY, _F.BYTES, _F.BYTES), CompareSet, CompareSet),
    QueryType.GET: ((_F.KEY,), Get, Get),
    QueryType.ADD: ((_F.KEY, _F.I64), Add, Add),
    QueryType.CHECK: ((_F.KEYS,), Check, Check),
    QueryType.WAIT: ((_F.KEYS,), Wait, Wait),
    QueryType.GETNUMKEYS: ((), GetNumKeys, GetNumKeys),
    QueryType.DELETE_KEY: ((_F.KEY,), DeleteKey, DeleteKey),
    QueryType.APPEND: ((_F.KEY, _F.BYTES), Append, Append),
    QueryType.MULTI_GET: ((_F.KEYS,), MultiGet, MultiGet),
    QueryType.MULTI_SET: ((_F.PAIRS,), MultiSet, _multi_set),
    QueryType.CANCEL_WAIT: ((), CancelWait, CancelWait),
    QueryType.PING: ((_F.U32,), Ping, Ping),
    QueryType.QUEUE_PUSH: ((_F.KEY, _F.BYTES), QueuePush, QueuePush),
    QueryType.QUEUE_POP: ((_F.KEY,), QueuePop, QueuePop),
    QueryType.QUEUE_LEN: ((_F.KEY,), QueueLen, QueueLen),
    QueryType.LIST_KEYS: ((), ListKeys, ListKeys),
    QueryType.BARRIER: ((_F.KEY, _F.I64), Barrier, Barrier),
}
_QUERY_OF: Final = {cls: query for query, (_, cls, _) in _LAYOUTS.items()}

_MISSING: Final = object()  # "the buffer ends before this field does"


def _decode_key(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _encode_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


class RequestParser:
    """Incremental parser for one connection's byte stream (server side).

    ``parser.feed(data)``, then ``for request in parser: ...`` (or ``parser.parse(data)``, a
    list). A partial request is kept field by field (a list of 100k keys resumes where it
    stopped, it is not re-read), so the work is linear in the bytes received however they are
    split, and the parser holds at most one request's bytes (bounded by the limits).
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS, *, validated: bool = False) -> None:
        self._limits = limits
        self._validated = validated
        self._buf = bytearray()
        self._pos = 0
        self._reset()

    def _reset(self) -> None:
        self._query: QueryType | None = None
        self._layout: tuple[_F, ...] = ()
        self._fields: list[Any] = []
        self._items: list[Any] | None = None  # a KEYS/PAIRS field in progress
        self._count = 0  # how many items that field declared (PAIRS: twice the pairs)
        self._size: int | None = None  # a sized field's length, read before its bytes
        self._declared = 0  # bytes this request has declared so far

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a returned request."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream; iterate over the parser for the requests."""
        if self._pos:
            del self._buf[: self._pos]  # bytearray drops a prefix without copying the rest
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[Request]:
        """The requests completed so far, in order; stops at the first incomplete one. Raises
        ProtocolError where the stream stops being torch's protocol (the requests before it
        were yielded first)."""
        while (request := self._next()) is not None:
            yield request

    def parse(self, data: bytes) -> list[Request]:
        """``feed(data)`` and every request it completes, as a list."""
        self.feed(data)
        return list(self)

    def _next(self) -> Request | None:
        if self._query is None:
            if self._pos >= len(self._buf):
                return None
            self._start(self._buf[self._pos])
            self._pos += 1
        while len(self._fields) < len(self._layout):
            value = self._field(self._layout[len(self._fields)])
            if value is _MISSING:
                return None
            self._fields.append(value)
        query, fields = self._query, self._fields
        assert query is not None
        if query is QueryType.VALIDATE:
            self._check_magic(fields[0])
        self._reset()
        return _LAYOUTS[query][2](*fields)

    def _start(self, byte: int) -> None:
        try:
            query = QueryType(byte)
        except ValueError:
            raise ProtocolError(
                f"unknown query type {byte} (torch 2.13 sends 0..{max(QueryType)})"
            ) from None
        if (query is QueryType.VALIDATE) == self._validated:
            raise ProtocolError(
                "a connection must start with VALIDATE and send it once; got "
                f"{query.name} {'again' if self._validated else 'first'}"
            )
        self._query, self._layout = query, _LAYOUTS[query][0]

    def _check_magic(self, value: int) -> None:
        if value != VALIDATION_MAGIC:
            raise ProtocolError(
                f"bad validation number {value:#010x} (torch sends {VALIDATION_MAGIC:#010x})"
            )
        self._validated = True

    def _field(self, kind: _F) -> Any:
        if kind is _F.KEY:
            raw = self._sized(self._limits.max_key_bytes, "key")
            return raw if raw is _MISSING else _decode_key(raw)
        if kind is _F.BYTES:
            return self._sized(self._limits.max_value_bytes, "value")
        if kind is _F.U32:
            return self._fixed(_U32)
        if kind is _F.I64:
            return self._fixed(_I64)
        return self._list(kind)

    def _fixed(self, fmt: struct.Struct) -> Any:
        if len(self._buf) - self._pos < fmt.size:
            return _MISSING
        (value,) = fmt.unpack_from(self._buf, self._pos)
        self._pos += fmt.size
        return value

    def _sized(self, limit: int, what: str) -> Any:
        """A u64 length and that many bytes; the length is checked before the bytes are awaited."""
        if self._size is None:
            size = self._fixed(_U64)
            if size is _MISSING:
                return _MISSING
            if size > limit:
                raise ProtocolError(
                    f"{what} of {size} bytes in {self._name()} (the limit is {limit})"
                )
            self._declare(size)
            self._size = size
        end = self._pos + self._size
        if len(self._buf) < end:
            return _MISSING
        with memoryview(self._buf) as view:  # one copy of a value, not two
            raw = bytes(view[self._pos : end])
        self._pos, self._size = end, None
        return raw

    def _list(self, kind: _F) -> Any:
        if self._items is None:
            count = self._fixed(_U64)
            if count is _MISSING:
                return _MISSING
            if count > self._limits.max_keys:
                raise ProtocolError(
                    f"{count} keys in {self._name()} (the limit is {self._limits.max_keys})"
                )
            self._items, self._count = [], count * (2 if kind is _F.PAIRS else 1)
        items = self._items
        while len(items) < self._count:
            is_value = kind is _F.PAIRS and len(items) % 2 == 1
            item = self._field(_F.BYTES if is_value else _F.KEY)
            if item is _MISSING:
                return _MISSING
            items.append(item)
        self._items = None
        return tuple(items)

    def _declare(self, size: int) -> None:
        self._declared += size
        if self._declared > self._limits.max_request_bytes:
            raise ProtocolError(
                f"{self._name()} declares more than {self._limits.max_request_bytes} bytes "
                "of keys and values"
            )

    def _name(self) -> str:
        return self._query.name if self._query is not None else "request"


# --- encoders ---------------------------------------------------------------------------------


def _sized_bytes(raw: bytes) -> bytes:
    return _U64.pack(len(raw)) + raw


def _encode_field(kind: _F, value: Any) -> bytes:
    if kind is _F.KEY:
        return _sized_bytes(_encode_key(value))
    if kind is _F.BYTES:
        return _sized_bytes(value)
    if kind is _F.U32:
        return _U32.pack(value)
    if kind is _F.I64:
        return _I64.pack(value)
    if kind is _F.KEYS:
        return _U64.pack(len(value)) + b"".join(_sized_bytes(_encode_key(k)) for k in value)
    keys, values = value
    parts = (
        _sized_bytes(_encode_key(k)) + _sized_bytes(v) for k, v in zip(keys, values, strict=True)
    )
    return _U64.pack(len(keys)) + b"".join(parts)


def _fields_of(request: Request) -> tuple[Any, ...]:
    if isinstance(request, Validate):
        return (VALIDATION_MAGIC,)
    if isinstance(request, MultiSet):
        if len(request.keys) != len(request.values):
            raise ValueError(
                f"MultiSet has {len(request.keys)} keys but {len(request.values)} values"
            )
        return ((request.keys, request.values),)
    return request.fields()


def encode_request(request: Request) -> bytes:
    """The bytes torch's client sends for ``request`` (client side; tests and tools)."""
    query = _QUERY_OF[type(request)]
    layout = _LAYOUTS[query][0]
    fields = _fields_of(request)
    return bytes([query]) + b"".join(
        _encode_field(k, v) for k, v in zip(layout, fields, strict=True)
    )


def encode_nonce(nonce: int) -> bytes:
    """PING's answer: the client's nonce, echoed."""
    return _U32.pack(nonce)


def encode_bytes(value: bytes) -> bytes:
    """GET's and COMPARE_SET's answer: a u64 length and the value."""
    return _sized_bytes(value)


def encode_int(value: int) -> bytes:
    """ADD's, GETNUMKEYS's, DELETE_KEY's (0 or 1) and QUEUE_LEN's answer: an i64."""
    return _I64.pack(value)


def encode_check(ready: bool) -> bytes:
    return bytes([CheckResponse.READY if ready else CheckResponse.NOT_READY])


STOP_WAITING: Final = bytes([WaitResponse.STOP_WAITING])
WAIT_CANCELED: Final = bytes([WaitResponse.WAIT_CANCELED])


def encode_multi_get(values: Sequence[bytes]) -> bytes:
    """MULTI_GET's answer: one sized value per key, in the request's order (no count)."""
    return b"".join(_sized_bytes(v) for v in values)


def encode_queue_pop(value: bytes | None) -> bytes:
    """QUEUE_POP's answer: an i64 (torch: the queue's length before the pop; its client only
    tests > 0), then the value when there was one."""
    return _I64.pack(0) if value is None else _I64.pack(1) + _sized_bytes(value)


def encode_list_keys(keys: Sequence[str]) -> bytes:
    """LIST_KEYS's answer: an i64 count and that many sized keys."""
    return _I64.pack(len(keys)) + b"".join(_sized_bytes(_encode_key(k)) for k in keys)
