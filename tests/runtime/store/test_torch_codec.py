"""The codec alone: the bytes torch 2.13's client was recorded sending (see record_wire.py)
parse to the right requests, any split of a stream parses the same, and every bound holds."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.runtime.store import torch_protocol as codec
from xrun.runtime.store.torch_protocol import (
    HANDSHAKE_PREFIX,
    Add,
    Append,
    Barrier,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    Limits,
    ListKeys,
    MultiGet,
    MultiSet,
    Ping,
    ProtocolError,
    QueueLen,
    QueuePop,
    QueuePush,
    Request,
    RequestParser,
    Set,
    Validate,
    Wait,
    encode_request,
)

# What torch 2.13's TCPStore client sent (c->s), recorded through a proxy to torch's own server.
RECORDED: list[tuple[str, Request]] = [
    ("00cef7853c", Validate()),
    ("0d09680000", Ping(0x6809)),
    ("01 0200000000000000 2f6b 0200000000000000 7631", Set("/k", b"v1")),
    ("06 0100000000000000 0200000000000000 2f6b", Wait(("/k",))),
    ("03 0200000000000000 2f6b", Get("/k")),
    ("04 0200000000000000 2f6e feffffffffffffff", Add("/n", -2)),
    (
        "02 0200000000000000 2f6b 0200000000000000 7a7a 0200000000000000 7633",
        CompareSet("/k", b"zz", b"v3"),
    ),
    (
        "05 0200000000000000 0200000000000000 2f6b 0500000000000000 2f6e6f7065",
        Check(("/k", "/nope")),
    ),
    ("0c", CancelWait()),
    ("07", GetNumKeys()),
    ("08 0200000000000000 2f63", DeleteKey("/c")),
    ("09 0600000000000000 2f6672657368 0200000000000000 6162", Append("/fresh", b"ab")),
    (
        "0b 0200000000000000 0300000000000000 2f6d31 0100000000000000 78"
        " 0300000000000000 2f6d32 0200000000000000 7979",
        MultiSet(("/m1", "/m2"), (b"x", b"yy")),
    ),
    (
        "0a 0200000000000000 0300000000000000 2f6d31 0300000000000000 2f6d32",
        MultiGet(("/m1", "/m2")),
    ),
    ("0e 0200000000000000 2f71 0400000000000000 6974656d", QueuePush("/q", b"item")),
    ("10 0200000000000000 2f71", QueueLen("/q")),
    ("0f 0200000000000000 2f71", QueuePop("/q")),
    ("11", ListKeys()),
    ("12 0200000000000000 2f62 0100000000000000", Barrier("/b", 1)),
    ("01 0200000000000000 2f65 0000000000000000", Set("/e", b"")),
]


def test_recorded_client_bytes_parse_and_encode_back() -> None:
    stream = b"".join(bytes.fromhex(hex_) for hex_, _ in RECORDED)
    assert RequestParser().parse(stream) == [request for _, request in RECORDED]
    for hex_, request in RECORDED:
        assert encode_request(request) == bytes.fromhex(hex_)


def test_every_query_type_has_a_request() -> None:
    assert {type(r) for _, r in RECORDED} == set(codec._QUERY_OF)
    assert len(codec._LAYOUTS) == len(codec.QueryType) == 19


# --- any split of a stream of valid requests parses the same ---------------------------------

keys = st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape"))
values = st.binary(max_size=40)
key_lists = st.lists(keys, max_size=4).map(tuple)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)

requests = st.one_of(
    st.builds(Ping, st.integers(0, (1 << 32) - 1)),
    st.builds(Set, keys, values),
    st.builds(CompareSet, keys, values, values),
    st.builds(Get, keys),
    st.builds(Add, keys, i64),
    st.builds(Check, key_lists),
    st.builds(Wait, key_lists),
    st.just(GetNumKeys()),
    st.builds(DeleteKey, keys),
    st.builds(Append, keys, values),
    st.builds(MultiGet, key_lists),
    st.lists(st.tuples(keys, values), max_size=4).map(
        lambda kv: MultiSet(tuple(k for k, _ in kv), tuple(v for _, v in kv))
    ),
    st.just(CancelWait()),
    st.builds(QueuePush, keys, values),
    st.builds(QueuePop, keys),
    st.builds(QueueLen, keys),
    st.just(ListKeys()),
    st.builds(Barrier, keys, i64),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, max_size=12), st.data())
def test_any_split_parses_the_same(sent: list[Request], data: st.DataObject) -> None:
    stream = HANDSHAKE_PREFIX + b"".join(encode_request(r) for r in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    parser = RequestParser()
    got: list[Request] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += parser.parse(stream[start:end])
    assert got == [Validate(), *sent]
    assert parser.buffered == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(requests, min_size=1, max_size=6), st.data())
def test_a_truncated_stream_never_raises_and_keeps_the_rest(
    sent: list[Request], data: st.DataObject
) -> None:
    stream = HANDSHAKE_PREFIX + b"".join(encode_request(r) for r in sent)
    cut = data.draw(st.integers(0, len(stream) - 1))
    parser = RequestParser()
    got = parser.parse(stream[:cut])
    assert got == [Validate(), *sent][: len(got)]
    assert got + parser.parse(stream[cut:]) == [Validate(), *sent]


# --- bounds -----------------------------------------------------------------------------------

U64 = struct.Struct("<Q")
SMALL = Limits(max_key_bytes=8, max_value_bytes=16, max_keys=3, max_request_bytes=30)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01" + U64.pack(9), "key of 9 bytes in SET (the limit is 8)"),
        (b"\x01" + U64.pack(1) + b"k" + U64.pack(17), "value of 17 bytes in SET"),
        (b"\x0a" + U64.pack(4), "4 keys in MULTI_GET (the limit is 3)"),
        (
            b"\x02" + U64.pack(1) + b"k" + U64.pack(16) + b"x" * 16 + U64.pack(16),
            "COMPARE_SET declares more than 30 bytes",
        ),
        (b"\x13", "unknown query type 19"),
    ],
)
def test_limits_raise_before_the_bytes_arrive(data: bytes, message: str) -> None:
    parser = RequestParser(SMALL, validated=True)
    with pytest.raises(ProtocolError, match=re.escape(message)):
        parser.parse(data)


def test_a_value_at_the_limit_is_fine() -> None:
    parser = RequestParser(SMALL, validated=True)
    assert parser.parse(encode_request(Set("k" * 8, b"v" * 16))) == [Set("k" * 8, b"v" * 16)]


def test_validate_only_first_and_with_the_magic() -> None:
    with pytest.raises(ProtocolError, match="start with VALIDATE"):
        RequestParser().parse(encode_request(GetNumKeys()))
    with pytest.raises(ProtocolError, match="bad validation number 0x00000001"):
        RequestParser().parse(b"\x00\x01\x00\x00\x00")
    with pytest.raises(ProtocolError, match="VALIDATE again"):
        RequestParser().parse(HANDSHAKE_PREFIX * 2)


def test_keys_that_are_not_utf8_round_trip() -> None:
    raw_key = b"\xff\xfe/k"
    data = b"\x03" + U64.pack(len(raw_key)) + raw_key
    (request,) = RequestParser(validated=True).parse(data)
    assert isinstance(request, Get)
    assert encode_request(request) == data


def test_response_encoders() -> None:
    assert codec.encode_nonce(0x6809) == bytes.fromhex("09680000")
    assert codec.encode_bytes(b"v1") == bytes.fromhex("0200000000000000 7631")
    assert codec.encode_int(-1) == b"\xff" * 8
    assert codec.encode_check(True) == b"\x00"
    assert codec.encode_check(False) == b"\x01"
    assert (codec.STOP_WAITING, codec.WAIT_CANCELED) == (b"\x00", b"\x01")
    assert codec.encode_multi_get([b"x", b"yy"]) == bytes.fromhex(
        "0100000000000000 78 0200000000000000 7979"
    )
    assert codec.encode_queue_pop(None) == bytes(8)
    assert codec.encode_queue_pop(b"item") == bytes.fromhex(
        "0100000000000000 0400000000000000 6974656d"
    )
    assert codec.encode_list_keys(["/a"]) == bytes.fromhex("0100000000000000 0200000000000000 2f61")


def test_multi_set_with_mismatched_lengths_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        encode_request(MultiSet(("a", "b"), (b"x",)))


def test_the_server_tells_a_torch_client_by_its_handshake() -> None:
    # server.py keeps its own copy (the torch modules load with the first torch connection)
    from xrun.runtime.store import server

    assert server._TORCH_FIRST == HANDSHAKE_PREFIX
    assert not HANDSHAKE_PREFIX.startswith(server.HELLO[:1])  # xrun's client opens with "X"
