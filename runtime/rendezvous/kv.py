"""``KeyValue``: the agent's own keys in the job's store (``RendezvousHandler.kv()``), e.g. the
workers' store address that group rank 0 publishes each round."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..store.client import StoreClient
from ..store.errors import StoreError, StoreTimeoutError
from .api import RendezvousClosedError, RendezvousTimeoutError

__all__ = ["KeyValue"]


class KeyValue:
    """The agent's own keys in the store, namespaced by run id (``<run_id>/kv/<key>``).

    Store failures surface as RendezvousError subclasses, like every other rendezvous call."""

    def __init__(self, client: StoreClient, run_id: str) -> None:
        self._c = client
        self._prefix = f"{run_id}/kv/"

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except StoreTimeoutError as e:
            raise RendezvousTimeoutError(str(e)) from None
        except StoreError as e:
            raise RendezvousClosedError(f"rendezvous store: {e}") from None

    def set(self, key: str, value: bytes) -> None:
        with self._errors():
            self._c.set(self._prefix + key, value)

    def get(self, key: str, timeout: float) -> bytes:
        """Wait (server-side) until ``key`` is set; RendezvousTimeoutError after ``timeout`` s."""
        with self._errors():
            vals = self._c.wait([self._prefix + key], timeout=timeout)
        if vals is None or vals[0] is None:
            raise RendezvousTimeoutError(f"key {key!r} was not set within {timeout:g}s")
        return vals[0]

    def add(self, key: str, delta: int) -> int:
        with self._errors():
            return self._c.add(self._prefix + key, delta)

    def close(self) -> None:
        self._c.close()
