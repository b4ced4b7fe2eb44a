"""xrun's wire format on its own: the server-side ``RequestParser`` (handshake, framing, typed
requests) against the client-side encoders, and its limits."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from xrun.runtime.store.errors import ProtocolError
from xrun.runtime.store.protocol import (
    HELLO,
    MAGIC,
    MAX_HANDSHAKE_FRAME,
    Add,
    Credentials,
    Delete,
    Hello,
    Lease,
    Op,
    Ping,
    RequestParser,
    Set,
    Wait,
    add_fields,
    decode_request,
    encode_request,
    encode_verdict,
    lease_fields,
    pack_bytes,
    request_fields,
    wait_fields,
)

CREDENTIALS = pack_bytes(MAGIC + b"m" * 32)

REQUESTS = [
    (
        encode_request(1, Op.SET, pack_bytes(b"k"), pack_bytes(b"\x00v\xff")),
        Set,
        (1, "k", b"\x00v\xff"),
    ),
    (encode_request(2, Op.ADD, add_fields("n", -5)), Add, (2, "n", -5)),
    (
        encode_request(3, Op.WAIT, wait_fields(["a", "b"], False, 2.5)),
        Wait,
        (3, False, 2.5, ("a", "b")),
    ),
    (encode_request(4, Op.WAIT, wait_fields(["a"], True, None)), Wait, (4, True, -1.0, ("a",))),
    (encode_request(5, Op.DELETE, pack_bytes(b"k")), Delete, (5, "k")),
    (
        encode_request(6, Op.LEASE, lease_fields("l", 3.0, "f", b"gone", True)),
        Lease,
        (6, "l", 3.0, "f", b"gone", True),
    ),
    (
        encode_request(0, Op.LEASE, lease_fields("l", 0, "", b"")),
        Lease,
        (0, "l", 0.0, "", b"", False),
    ),
    (encode_request(7, Op.PING), Ping, (7,)),
]


def fields(value: Any) -> tuple[Any, ...]:
    slots = [s for cls in reversed(type(value).__mro__) for s in getattr(cls, "__slots__", ())]
    return tuple(getattr(value, s) for s in slots)


@pytest.mark.parametrize(("frame", "cls", "expected"), REQUESTS)
def test_each_request_decodes_to_its_value(
    frame: bytes, cls: type, expected: tuple[Any, ...]
) -> None:
    value = decode_request(frame[4:])
    assert type(value) is cls and fields(value) == expected


@pytest.mark.parametrize(("frame", "cls", "expected"), REQUESTS)
def test_each_decoded_request_encodes_back_to_its_bytes(
    frame: bytes, cls: type, expected: tuple[Any, ...]
) -> None:
    # one layout per op serves both directions (LAYOUTS): a decoded value's fields, written
    # again, are the frame it came from
    rid, *values = expected
    op = Op(frame[8])
    assert encode_request(rid, op, request_fields(op, *values)) == frame


def test_the_wire_bytes_of_each_request_are_pinned() -> None:
    # the format of the docs and of older agents: byte for byte, whatever builds it
    assert request_fields(Op.SET, "k", b"v") == bytes.fromhex("000000016b0000000176")
    assert add_fields("n", -5) == bytes.fromhex("000000016e") + struct.pack("!q", -5)
    assert wait_fields(["a"], False, None) == bytes.fromhex(
        "01" + struct.pack("!d", -1.0).hex() + "00000001" + "0000000161"
    )
    assert lease_fields("l", 3.0, "f", b"x", True) == (
        bytes.fromhex("000000016c")
        + struct.pack("!d", 3.0)
        + bytes.fromhex("0000000166" + "0000000178" + "01")
    )
    assert request_fields(Op.DELETE, "k") == bytes.fromhex("000000016b")
    assert encode_request(7, Op.PING) == bytes.fromhex("00000005" + "00000007" + "06")


def test_a_stream_split_anywhere_parses_the_same() -> None:
    stream = HELLO + CREDENTIALS + b"".join(frame for frame, _, _ in REQUESTS)
    whole = RequestParser()
    whole.feed(stream)
    expected = [(type(m), fields(m)) for m in whole]
    assert [t for t, _ in expected] == [Hello, Credentials] + [cls for _, cls, _ in REQUESTS]
    assert expected[1] == (Credentials, (b"m" * 32,))
    byte_by_byte = RequestParser()
    got = []
    for i in range(len(stream)):
        byte_by_byte.feed(stream[i : i + 1])
        got += [(type(m), fields(m)) for m in byte_by_byte]
    assert got == expected


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        (b"XRUNKV1", "bad handshake"),  # another version's HELLO
        (HELLO + pack_bytes(b"XRUNKV1" + b"m"), "bad handshake"),
        # Before the credentials: no frame over MAX_HANDSHAKE_FRAME, refused on its length alone.
        (HELLO + struct.pack("!I", MAX_HANDSHAKE_FRAME + 1), "handshake frame of 257 bytes"),
        (HELLO + CREDENTIALS + struct.pack("!I", 1025), "exceeds the 1024-byte limit"),
        (HELLO + CREDENTIALS + pack_bytes(struct.pack("!IB", 1, 99)), "unknown op 99"),
        (HELLO + CREDENTIALS + pack_bytes(struct.pack("!IB", 1, Op.SET) + b"\x00"), "truncated"),
        (
            HELLO + CREDENTIALS + encode_request(1, Op.SET, pack_bytes(b"\xff"), pack_bytes(b"")),
            "not UTF-8",
        ),
    ],
)
def test_what_is_not_the_protocol_is_a_protocol_error(stream: bytes, error: str) -> None:
    parser = RequestParser(max_frame=1024)
    parser.feed(stream)
    with pytest.raises(ProtocolError, match=error):
        list(parser)


def test_the_credentials_frame_may_be_short_of_a_mac() -> None:
    # A client without a token sends MAGIC alone; the handler decides, not the parser.
    parser = RequestParser()
    parser.feed(HELLO + pack_bytes(MAGIC))
    hello, creds = list(parser)
    assert isinstance(hello, Hello) and isinstance(creds, Credentials) and creds.mac == b""


def test_verdicts() -> None:
    assert encode_verdict(None) == pack_bytes(b"\x00")
    assert encode_verdict("no") == pack_bytes(b"\x01no")
