"""The store's exceptions, shared by the key space, the server's sessions and the client."""

from __future__ import annotations

__all__ = [
    "ProtocolError",
    "Refused",
    "StoreAuthError",
    "StoreError",
    "StoreHandshakeError",
    "StoreTimeoutError",
]


class StoreError(Exception):
    """The store could not be reached, or answered with an error."""


class StoreAuthError(StoreError):
    """The store rejected this client's token (or lack of one)."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking wait (or a read) ran out of time."""


class ProtocolError(StoreError):
    """The peer sent bytes that are not valid protocol."""


class Refused(ProtocolError):
    """Server side: a client failed the handshake's check and its verdict was sent; the
    connection half-closes (an abrupt close could destroy the verdict before the client reads
    it) and ignores what else the client sends."""


class StoreHandshakeError(StoreError):
    """The store closed the connection before it answered our handshake: it was overloaded
    (it drops a client that does not finish the handshake in time) or going away. Not a
    refusal (that comes with a reason): connecting again may work."""
