"""The agents' own keys on an etcd job (``EtcdRendezvousHandler.kv()``): in the store that the
round's group rank 0 serves for the workers (etcd.py, "The workers' store"), as c10d's are in its
rendezvous store. The stall watchdog shares the nodes' progress there (diagnose/shared.py): with
no keys at all, a node whose ranks wait in a collective while another node's rank 0 evaluates or
saves a checkpoint saw no progress anywhere and ended a healthy job.

Every agent's store admits xrun's protocol with that agent's own random token only, so group rank
0's agent publishes its token for the round, on its first ``kv()`` call, in one etcd key beside the
job's (``<etcd_prefix>/<run_id>.kv``: outside ``<run_id>/``, so that the agents' watches on the
job's keys do not wake for it) bound to its lease: ``{"round": N, "token": HEX}``. The others read
it on their first ``kv()`` of the round; before group rank 0 published it, ``kv()`` raises
RendezvousError (its callers are side features that try again). Cost: one put per round by one
agent, one get per round by each other agent, whatever the job's size. Whoever can read the job's
etcd keys can write keys in that store: no more than what etcd's access gives already (the job's
state, its verdict).

Each ``kv()`` of a round returns the same ``KeyValue`` (one connection per agent); a new round
closes the last one's.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from ..store.client import StoreClient
from ..store.errors import StoreError
from .api import RendezvousClosedError, RendezvousError
from .endpoint import Endpoint
from .etcd_kv import EtcdClient, EtcdError
from .kv import KeyValue

__all__ = ["AgentKeys"]


class AgentKeys:
    """One agent's ``kv()``: ``key`` is the published token's key; ``token`` this agent's own
    store's; ``timeout``: the store connection's connect and read timeout."""

    def __init__(
        self, etcd: EtcdClient, key: str, run_id: str, token: bytes, timeout: float
    ) -> None:
        self._etcd, self._key, self._run_id = etcd, key, run_id
        self._token, self._timeout = token, timeout
        self._lock = threading.Lock()
        self._kv: tuple[int, KeyValue] | None = None  # (round, its keys)
        self._closed = False

    def of_round(
        self, rnd: int, place: tuple[int, list[Any]] | None, here: tuple[str, int], lease: int
    ) -> KeyValue:
        """The keys of round ``rnd`` where we are at ``place`` (group rank, members; None: no
        round formed yet): in our own store (``here``) as its group rank 0, else in rank 0's."""
        if place is None:
            raise RendezvousError("no round has formed yet")
        ep = Endpoint.parse(place[1][0][4])
        return self.get(rnd, place[0] == 0, here if place[0] == 0 else (ep.host, ep.port), lease)

    def get(self, rnd: int, host: bool, store: tuple[str, int], lease: int) -> KeyValue:
        """The keys of round ``rnd`` in ``store`` (group rank 0's), ``host``: ours; ``lease``:
        ours, which the published token is bound to. Never holds the lock across a call."""
        with self._lock:
            if self._kv is not None and self._kv[0] == rnd and not self._closed:
                return self._kv[1]
        try:
            if host:
                doc = {"round": rnd, "token": self._token.hex()}
                self._etcd.put(self._key, json.dumps(doc).encode(), lease)
                token = self._token
            else:
                token = self._published(rnd)
        except EtcdError as e:
            raise RendezvousError(f"the agents' keys: etcd: {e}") from None
        try:
            client = StoreClient(
                *store, token, connect_timeout=self._timeout, read_timeout=self._timeout
            )
        except StoreError as e:
            raise RendezvousClosedError(f"the agents' keys: group rank 0's store: {e}") from None
        kv = KeyValue(client, self._run_id)
        with self._lock:
            if self._closed or (self._kv is not None and self._kv[0] >= rnd):
                client.close()  # shut down, or another thread was first
                if self._closed or self._kv is None:
                    raise RendezvousClosedError("the rendezvous handler shut down")
                return self._kv[1]
            old, self._kv = self._kv, (rnd, kv)
        if old is not None:
            old[1].close()
        return kv

    def _published(self, rnd: int) -> bytes:
        entry = self._etcd.get(self._key)
        try:
            doc = json.loads(entry.value) if entry is not None else {}
            if doc.get("round") == rnd:
                return bytes.fromhex(doc["token"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise RendezvousError(f"group rank 0 has not published its store's keys for round {rnd}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            old, self._kv = self._kv, None
        if old is not None:
            old[1].close()
