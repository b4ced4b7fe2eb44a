"""``StoreLink``: where a handler's store is (served by this agent, or reached at the endpoint)
and the connections the handler keeps to it. The store is the workers' store too (torch's
TCPStore protocol on the same port), so the agent that serves it serves the job's workers.

``c10d``: the agent whose endpoint host is a local address binds the endpoint and serves the
store (if the port is taken, another agent on this host won, and this one connects as a
client); the rest connect with retry and backoff. ``static``: node rank 0 serves it. Conf
``is_host`` forces (true) or forbids (false) serving on this node.
"""

from __future__ import annotations

import errno
import socket
import threading
import time

from xrun.errors import UsageError

from ..store.client import StoreClient
from ..store.server import StoreServer
from .api import RendezvousParams
from .conf import RdzvConfig
from .endpoint import Endpoint, bind_address
from .keys import HOST_KEY, Keys

__all__ = ["StoreLink"]


class StoreLink:
    """The job's store as one handler sees it. Binds the store in ``__init__`` when this agent
    should host it; its connection opens on first use:

    * ``client``: the handler's one connection, for its calls, the round watch (a WAIT parked
      on the server) and the heartbeats (until the store's host is up, connecting retries for
      up to join_timeout);
    * ``open_client()``: a connection of its own for the agent's keys (``KeyValue``).
    """

    def __init__(self, params: RendezvousParams, cfg: RdzvConfig, token: bytes | None) -> None:
        self.params = params
        self.cfg = cfg
        self._token = token
        self.server: StoreServer | None = None
        self._host_name = params.endpoint.host
        self._connect_host, self._port = self._maybe_serve(params.endpoint)
        self._client: StoreClient | None = None
        self._connect_lock = threading.Lock()

    def _maybe_serve(self, endpoint: Endpoint) -> tuple[str, int]:
        """Bind the store here when this agent should host it; returns where to connect."""
        p, cfg = self.params, self.cfg
        host, port = endpoint.host, endpoint.port
        if p.backend == "static":
            want = p.node_rank == 0 if cfg.is_host is None else cfg.is_host
            must = want
        elif cfg.is_host is not None:
            want = must = cfg.is_host
        else:
            want, must = True, port == 0
        if not want:
            if port == 0:
                raise UsageError(
                    f"rendezvous endpoint {endpoint} asks for a free port, "
                    f"which only the agent serving the store can pick; drop is_host=false or "
                    f"give a fixed port"
                )
            return host, port
        try:
            addr = bind_address(host)
        except OSError as e:
            raise UsageError(
                f"cannot resolve the rendezvous endpoint host {host!r}: {e}; use a resolvable "
                f"host name or an IP address"
            ) from None
        # The port can be taken by a socket that serves nothing: another program's outgoing
        # connection got it as its local port, or a peer agent is between its bind and listen.
        # Then nobody would ever serve the store and every agent would retry connecting until
        # join_timeout ("connection refused"): instead bind again until one agent serves it.
        deadline = time.monotonic() + cfg.join_timeout
        delay = 0.01
        while True:
            taken = self._serve(addr, port, must)
            if self.server is not None:
                return addr, self.server.port
            # EADDRNOTAVAIL: not an address of this host, the store is served elsewhere.
            if taken == errno.EADDRNOTAVAIL or _serving(addr, port):
                return addr, port  # (or another agent on this host serves it)
            if time.monotonic() + delay > deadline:
                raise UsageError(
                    f"cannot serve the rendezvous store on {Endpoint(addr, port)}: the "
                    f"port is taken on this host by a socket that serves nothing (for "
                    f"join_timeout={cfg.join_timeout:g}s); pick a free port"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _serve(self, addr: str, port: int, must: bool) -> int:
        """Serve the store on ``addr:port`` (sets ``server``: 0), or the errno that says it is
        someone else's to serve (EADDRINUSE, EADDRNOTAVAIL; only when not ``must``)."""
        run_id = self.params.run_id
        try:
            # Which job this store belongs to, there before any peer can ask (see the handler's
            # host check).
            self.server = StoreServer(
                addr,
                port,
                self._token,
                seed={HOST_KEY: run_id.encode()},
                workers_key=Keys(run_id).workers,
            )
        except OSError as e:
            if not must and e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                return e.errno
            raise UsageError(
                f"cannot serve the rendezvous store on {Endpoint(addr, port)}: "
                f"{e.strerror or e}; pick a free port (or port 0 on a single node)"
            ) from None
        return 0

    @property
    def endpoint(self) -> Endpoint:
        """The store's real endpoint (port 0 resolved)."""
        return Endpoint(self._host_name, self._port)

    @property
    def workers_address(self) -> tuple[str, int]:
        """Where the workers reach the store (torch's protocol, same port): MASTER_ADDR and
        MASTER_PORT. The endpoint's host as the user wrote it (the static backend's
        --master-addr), save "localhost", which the store binds as 127.0.0.1 only."""
        host = self._host_name
        return (bind_address(host) if host == "localhost" else host), self._port

    @property
    def is_host(self) -> bool:
        return self.server is not None

    @property
    def connected(self) -> StoreClient | None:
        """The connection if it is open (never opens one)."""
        return self._client

    @property
    def client(self) -> StoreClient:
        if self._client is None:
            with self._connect_lock:
                if self._client is None:
                    self._client = StoreClient(
                        self._connect_host,
                        self._port,
                        self._token,
                        connect_timeout=self.cfg.join_timeout,
                        read_timeout=self.cfg.read_timeout,
                        lazy_verdict=True,
                    )
        return self._client

    def open_client(self) -> StoreClient:
        """A new connection for the agent's keys, so that a blocking ``get`` there never holds
        up the handler's calls."""
        return StoreClient(
            self._connect_host,
            self._port,
            self._token,
            connect_timeout=self.cfg.read_timeout,
            read_timeout=self.cfg.read_timeout,
        )

    def close(self) -> None:
        """Close the handler's client and stop the store if this agent serves it."""
        if self._client is not None:
            self._client.close()
        if self.server is not None:
            self.server.stop()


def _serving(addr: str, port: int) -> bool:
    """Whether something accepts connections on ``addr:port`` (a refused connect: nothing)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect((addr, port))
        except ConnectionRefusedError:
            return False
        except OSError:
            return True  # e.g. a timeout: a busy server; the client's connect retries
    return True
