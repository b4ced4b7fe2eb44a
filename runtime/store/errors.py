"""The store's exceptions, shared by the key space, the server's sessions and the client."""

from __future__ import annotations

__all__ = ["ProtocolError", "StoreAuthError", "StoreError", "StoreTimeoutError"]


class StoreError(Exception):
    """The store could not be reached, or answered with an error."""


class StoreAuthError(StoreError):
    """The store rejected this client's token (or lack of one)."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking wait (or a read) ran out of time."""


class ProtocolError(StoreError):
    """The peer sent bytes that are not valid protocol."""
