"""Rendezvous: how the agents of one job find each other and agree on a world, round after round.

``create_handler(params)`` returns a ``RendezvousHandler``; the agent calls ``next_rendezvous()``
to join a round, ``select()``s on ``fileno()`` while its workers run, and asks ``poll_event()``
what happened when that fd becomes readable. Standard library only.

Backends
--------
``c10d`` (the name torchrun users know; the protocol is xrun's own, on ``runtime/store.py``):
the agent whose endpoint host is a local address binds the endpoint and serves the store (if the
port is taken, another agent on this host won, and this one connects as a client); the rest
connect with retry and backoff. ``static``: node rank 0 serves the store at the endpoint
(``master_addr:master_port``), ranks come from ``node_rank`` and the world is exactly
``max_nodes`` nodes.

Protocol (keys under ``<run_id>/rdzv/``; round ``r`` counts up from 0)
-------------------------------------------------------------------
* join: ``i = ADD r/join 1`` gives the node its arrival index (1-based); then, without waiting
  for answers, ``SET r/node/i = "<nproc>\\t<sortkey>\\t<addr>"`` and two leases owned by the
  node's connection: ``r/lease/i`` (renewed by heartbeats; on expiry or disconnect it sets
  ``r/stale``) and ``r/finlease/i`` (on disconnect it sets ``r/fin/i``: "gone").
* seal: the round is sealed by whoever first adds ``SEAL`` (2**40) to ``r/join``: the node that
  arrives as number ``max_nodes``, or (once ``min_nodes`` are in) any node whose last-call timer
  expired with no new arrival, or any node that sees ``r/stale`` before the round formed (a
  joiner died: form now, stale, and re-form without it). The winner reads ``r/node/1..n`` and
  writes ``r/world`` and ``cur = r + 1``. A later ``ADD r/join 1`` returns >= ``SEAL`` (or
  > ``max_nodes``), so latecomers move on to round ``r + 1``.
* one world at a time: round ``r + 1`` may seal only once ``r/stale`` is set. A node arriving
  while a world with room runs sets ``r/stale`` ("waiting to join") so that world re-forms with
  it; next to a full world it stands by (until join_timeout) instead of forming a second world.
* everyone waits *on the server* for ``r/world`` (or ``closed``, ``r/stale``, or the next
  arrival while the last call runs): O(1) messages per node, nothing rewritten by everybody.
* during the round, ``fileno()`` is a socket with a pending ``WAIT any(r/stale, closed)``: it
  becomes readable exactly when the round is stale or the job closed.
* leave together: ``finish``/``shutdown`` set ``r/fin/i``; the store's host waits for every
  member's ``fin`` (set by itself, or by its closed connection) before it stops serving, and
  after a successful finish sets ``closed`` = not failed, "the job finished". That wait is
  torchrun's exit barrier, bounded by conf ``exit_barrier_timeout`` (300 s), not by
  ``close_timeout`` (how long a host that *gave up* keeps serving so peers read why).
* ``closed`` holds ``{"failed": bool, "reason": str}``: ``poll_event`` reports CLOSED and
  ``closed_failed`` says which, so an agent tells "a peer gave up" (exit 1) from "the job
  finished" (exit 0).

The job's secret: when ``$XRUN_RDZV_TOKEN``, a file named by ``$XRUN_RDZV_TOKEN_FILE`` or conf
``token_file`` gives one (multi-node jobs: the scheduler generates it per job and exports it),
the store admits only clients that prove they hold it (HMAC challenge-response, see
``store.py``); it never appears on a command line, and workers never see it. A standalone agent
(endpoint port 0: nobody else can find its store) makes up a random secret when none is given,
so no store an agent serves is ever open to other local users.

One store, one job
------------------
The store lives inside one agent of one job and stops when that job is over (after the exit
barrier), so it cannot serve a second job that happens to use the same endpoint: that job
would lose its rendezvous mid-run. Keys are namespaced by run id all the same, but an agent
whose run id differs from the hosting job's (``xrun/host_run_id``, set before the store takes
its first connection) is refused at once with a ``UsageError`` telling it to use its own port.
Two jobs on one host therefore need two endpoints - port 0 / ``--standalone`` on a single node
picks a free one. (With per-job secrets the second job would be refused anyway: wrong token.)

Rank rule (deterministic): members are sorted by (advertised address, process id, creation order
of the handler in that process); ``static`` uses ``node_rank``. So the same hosts get the same
ranks in every round they are all part of, whatever the order in which they arrived.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import heapq
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from xrun.contract import RDZV_BACKENDS, RDZV_ENDPOINT_DEFAULT_PORT, TOKEN_ENV, TOKEN_FILE_ENV
from xrun.errors import UsageError

from .store.client import Connection, StoreClient, is_ip_literal
from .store.errors import StoreAuthError, StoreError, StoreTimeoutError
from .store.protocol import Op, Status, add_fields, encode_request, lease_fields, wait_fields
from .store.server import StoreServer

log = logging.getLogger(__name__)

# Set by the store's host when it starts serving: the run id of the job it belongs to.
HOST_KEY = "xrun/host_run_id"
SEAL = 1 << 40
_NEVER = 1e9  # a lease ttl that only a closed connection (or a release) ends


# ---------------------------------------------------------------------------------------------
# Public types


class RendezvousError(Exception):
    """Base class of every rendezvous failure."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """join_timeout expired before ``min_nodes`` nodes joined (or a kv get ran out of time)."""


class RendezvousClosedError(RendezvousError):
    """The job was closed: a peer gave up (``failed``), the job finished, or the store is gone."""

    def __init__(self, reason: str, failed: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.failed = failed


@dataclass(frozen=True)
class RendezvousParams:
    backend: str
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int
    local_world_size: int
    conf: Mapping[str, str]
    node_rank: int = -1
    local_addr: str | None = None
    # True when this handler is its store's only user (a standalone agent: port 0, a port
    # nobody else learns): with no secret configured, make up a random one, so that the store
    # is never open to other users of the host.
    private_store: bool = False


@dataclass(frozen=True)
class RendezvousInfo:
    round: int
    group_rank: int
    group_world_size: int
    local_world_sizes: tuple[int, ...]
    addrs: tuple[str, ...]

    @property
    def rank_offset(self) -> int:
        """Global rank of this node's local rank 0."""
        return sum(self.local_world_sizes[: self.group_rank])

    @property
    def world_size(self) -> int:
        return sum(self.local_world_sizes)


class RendezvousEvent(enum.Enum):
    RESTART = "restart"
    CLOSED = "closed"


# ---------------------------------------------------------------------------------------------
# --rdzv-conf


@dataclass(frozen=True)
class RdzvConfig:
    """The typed form of ``--rdzv-conf`` (seconds for every timeout)."""

    # How long next_rendezvous waits for a world to form (also: for the store to come up).
    join_timeout: float = 600.0
    # With MIN..MAX nodes: how long after the latest arrival a round with >= MIN nodes waits
    # for more before it forms.
    last_call_timeout: float = 30.0
    # How long the store's host keeps serving after close() so that peers read the verdict.
    close_timeout: float = 30.0
    # torchrun's exit barrier: how long the store's host, its own workers done, waits for the
    # other nodes' workers to finish before it closes the job (as failed, naming the laggards)
    # and stops serving. Long on purpose: nodes of one job may finish minutes apart (a slower
    # GPU, a last checkpoint), and a shorter bound fails a job whose every worker succeeded.
    exit_barrier_timeout: float = 300.0
    # A node renews its lease every heartbeat_interval; one silent for heartbeat_timeout is
    # dropped (a node whose agent died is dropped at once: its connection closes).
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 15.0
    # How long a store request may take beyond its own server-side wait.
    read_timeout: float = 60.0
    # A file holding the job's secret (see load_token).
    token_file: str | None = None
    # torchrun's key: force (true) or forbid (false) serving the store on this node.
    is_host: bool | None = None


_SECONDS_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "exit_barrier_timeout",
    "heartbeat_interval",
    "heartbeat_timeout",
    "read_timeout",
)
CONF_KEYS = (*_SECONDS_KEYS, "timeout", "token_file", "is_host")
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def parse_rdzv_conf(s: str) -> dict[str, str]:
    """Split and validate ``--rdzv-conf`` (``"join_timeout=60,last_call_timeout=5"``).

    Returns the raw ``key -> value`` strings (what ``RendezvousParams.conf`` holds) after checking
    every key and value, so the agent can reject a typo before it starts anything.
    """
    out: dict[str, str] = {}
    for item in (p.strip() for p in s.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise UsageError(
                f"--rdzv-conf item {item!r} is not KEY=VALUE; expected e.g. "
                f"'join_timeout=600,last_call_timeout=30'"
            )
        out[key] = value.strip()
    config_from_conf(out)
    return out


def config_from_conf(conf: Mapping[str, str]) -> RdzvConfig:
    """Typed, validated config; raises UsageError naming the bad key, its form and the fix."""
    values: dict[str, Any] = {}
    for key, raw in conf.items():
        if key == "token":
            raise UsageError(
                "--rdzv-conf token=... would put the job's secret on the command line; set "
                f"${TOKEN_ENV}, ${TOKEN_FILE_ENV} or --rdzv-conf token_file=PATH instead"
            )
        if key not in CONF_KEYS:
            raise UsageError(f"unknown --rdzv-conf key {key!r}; valid keys: {', '.join(CONF_KEYS)}")
        if key in _SECONDS_KEYS or key == "timeout":
            try:
                v = float(raw)
            except ValueError:
                v = float("nan")
            if not v > 0 or v == float("inf"):
                raise UsageError(
                    f"--rdzv-conf {key}={raw!r} is not a positive number of seconds; "
                    f"write e.g. {key}={int(getattr(RdzvConfig, key, 600))}"
                )
            # torchrun's static rendezvous calls its join timeout plain "timeout".
            values["join_timeout" if key == "timeout" else key] = v
        elif key == "is_host":
            if raw.lower() not in _BOOLS:
                raise UsageError(
                    f"--rdzv-conf is_host={raw!r} is not a boolean; write is_host=true or is_host=false"
                )
            values[key] = _BOOLS[raw.lower()]
        else:  # token_file
            if not raw:
                raise UsageError(
                    "--rdzv-conf token_file= is empty; give the path of a file holding the job's secret"
                )
            values[key] = raw
    cfg = RdzvConfig(**values)
    if cfg.heartbeat_interval >= cfg.heartbeat_timeout:
        raise UsageError(
            f"--rdzv-conf heartbeat_interval={cfg.heartbeat_interval:g} must be smaller than "
            f"heartbeat_timeout={cfg.heartbeat_timeout:g} (a node would be dropped between two "
            f"heartbeats); e.g. heartbeat_interval=5,heartbeat_timeout=15"
        )
    return cfg


def load_token(cfg: RdzvConfig, env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's secret: conf ``token_file``, else file ``$XRUN_RDZV_TOKEN_FILE``, else
    ``$XRUN_RDZV_TOKEN``; None when none is configured. Never read from a command line."""
    env = os.environ if env is None else env
    path = cfg.token_file or env.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(path, "rb") as f:
                token = f.read().strip()
        except OSError as e:
            raise UsageError(
                f"cannot read the rendezvous token file {path!r}: {e.strerror}; "
                f"point token_file / ${TOKEN_FILE_ENV} at a readable file"
            ) from None
        if not token:
            raise UsageError(
                f"the rendezvous token file {path!r} is empty; write the job's secret in it"
            )
        return token
    token_s = env.get(TOKEN_ENV)
    return token_s.encode() if token_s else None


# ---------------------------------------------------------------------------------------------
# Endpoint


def parse_endpoint(
    endpoint: str, default_port: int = RDZV_ENDPOINT_DEFAULT_PORT
) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``host`` / ``v6`` -> (host, port)."""
    ep = endpoint.strip()
    form = "expected HOST, HOST:PORT or [IPV6]:PORT, e.g. node0:29400"
    if ep.startswith("["):
        host, sep, rest = ep[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise UsageError(f"rendezvous endpoint {endpoint!r} is malformed; {form}")
        port_s = rest[1:] if rest else ""
    elif ep.count(":") == 1:
        host, _, port_s = ep.partition(":")
    else:  # bare host name, or a bare IPv6 address (more than one colon)
        host, port_s = ep, ""
    if not host:
        raise UsageError(f"rendezvous endpoint {endpoint!r} has no host; {form}")
    if not port_s:
        return host, default_port
    if not port_s.isdigit() or int(port_s) > 65535:
        raise UsageError(
            f"rendezvous endpoint {endpoint!r} has port {port_s!r}, expected 0..65535; {form}"
        )
    return host, int(port_s)


def format_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_address(host: str) -> str:
    """The address the store listens on: the endpoint's own address, never 0.0.0.0."""
    if host == "localhost":
        return "127.0.0.1"
    if is_ip_literal(host):
        return host
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    v4 = [i[4][0] for i in infos if i[0] == socket.AF_INET]
    return str(v4[0] if v4 else infos[0][4][0])


def default_local_addr() -> str:
    """The name this node advertises: its FQDN, unless that is merely "localhost" (a host whose
    /etc/hosts maps its name to loopback), which peers on other hosts could not use."""
    fqdn = socket.getfqdn()
    if not fqdn or fqdn.split(".")[0] == "localhost":
        return socket.gethostname()
    return fqdn


# ---------------------------------------------------------------------------------------------
# Heartbeats: one thread per process, whatever the number of handlers (the benchmark runs 1024).


class _Heartbeats:
    """Renews every live handler's lease every heartbeat_interval from one daemon thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, RendezvousHandler]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def add(self, h: RendezvousHandler, due: float) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, h))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="xrun-rdzv-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is h:
                self._cond.notify()  # only an earlier deadline needs to wake the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, _, h = heapq.heappop(self._heap)
            try:
                nxt = h._beat()
            except Exception:  # one handler's bug must not stop everyone's heartbeats
                log.exception("rendezvous heartbeat failed")
                nxt = None
            if nxt is not None:
                self.add(h, nxt)


_HEARTBEATS = _Heartbeats()
_handler_seq = 0
_handler_seq_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# The agent's key-value client


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


# ---------------------------------------------------------------------------------------------
# The handler


@dataclass(frozen=True)
class _World:
    """A formed round as stored in ``<r>/world``: three sections separated by newlines:
    arrival indices in rank order ("3,1,2"), nprocs run-length encoded ("8*1024" or "8*2,4*1"),
    then one advertised address per line."""

    round: int
    indices: tuple[str, ...]  # arrival index (decimal) of each group rank
    local_world_sizes: tuple[int, ...]
    addrs: tuple[str, ...]

    @classmethod
    def parse(cls, rnd: int, blob: bytes) -> _World:
        # Kept to a few C-level splits: each of N nodes parses the N-node world (the benchmark
        # runs 1024 of them in one process), and nprocs are nearly always uniform.
        idx, lws_s, addrs = blob.decode().split("\n", 2)
        lws: list[int] = []
        for run in lws_s.split(","):
            n, _, count = run.partition("*")
            lws.extend([int(n)] * int(count))
        return cls(rnd, tuple(idx.split(",")), tuple(lws), tuple(addrs.split("\n")))

    @staticmethod
    def encode(members: list[tuple[str, str, int, int]]) -> bytes:
        """``(addr, sortkey, index, nproc)`` in rank order -> the stored form."""
        runs: list[list[int]] = []
        for m in members:
            if runs and runs[-1][0] == m[3]:
                runs[-1][1] += 1
            else:
                runs.append([m[3], 1])
        return "\n".join(
            [
                ",".join(str(m[2]) for m in members),
                ",".join(f"{n}*{k}" for n, k in runs),
                *(m[0] for m in members),
            ]
        ).encode()

    def rank_of(self, index: int) -> int:
        """Group rank of the node that arrived as ``index``, or -1 if it is not a member."""
        try:
            return self.indices.index(str(index))
        except ValueError:
            return -1


class RendezvousHandler:
    """One agent's membership in one job's rendezvous. Create with ``create_handler``."""

    def __init__(self, params: RendezvousParams, cfg: RdzvConfig, token: bytes | None) -> None:
        global _handler_seq
        self.params = params
        self.cfg = cfg
        self._token = token
        self._static = params.backend == "static"
        host, port = parse_endpoint(params.endpoint)
        self._server: StoreServer | None = None
        self._host_name = host
        connect_host, self._port = self._maybe_serve(host, port)
        self.addr = params.local_addr or default_local_addr()
        with _handler_seq_lock:
            _handler_seq += 1
            seq = _handler_seq
        if self._static:
            self._sortkey = f"{params.node_rank:08d}"
        else:
            self._sortkey = f"{os.getpid():08d}.{seq:08d}"
        self._connect_host = connect_host
        self._prefix = f"{params.run_id}/rdzv/"
        # Connected on first use (next_rendezvous), where the agent handles rendezvous errors;
        # until the store's host is up that means retrying for up to join_timeout.
        self._client_conn: StoreClient | None = None
        self._connect_lock = threading.Lock()
        self._lock = threading.Lock()  # guards the watch connection and the round state below
        self._round = -1
        self._index = 0
        self._rank = -1
        self._world: _World | None = None
        self._watch: Connection | None = None
        self._watch_rid = 0
        self._armed_rid = 0
        self._armed_for = -2
        self._event: tuple[RendezvousEvent, str] | None = None
        self._closed_failed = True
        self._finished = False
        self._closed = False
        self._shut = False
        self._kv: KeyValue | None = None

    # -- store hosting -------------------------------------------------------------------------

    def _maybe_serve(self, host: str, port: int) -> tuple[str, int]:
        """Bind the store here when this agent should host it; returns where to connect."""
        p, cfg = self.params, self.cfg
        if self._static:
            want = p.node_rank == 0 if cfg.is_host is None else cfg.is_host
            must = want
        elif cfg.is_host is not None:
            want = must = cfg.is_host
        else:
            want, must = True, port == 0
        if not want:
            if port == 0:
                raise UsageError(
                    f"rendezvous endpoint {format_endpoint(host, port)} asks for a free port, "
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
        try:
            # Which job this store belongs to, there before any peer can ask (see _check_host).
            self._server = StoreServer(addr, port, self._token, seed={HOST_KEY: p.run_id.encode()})
        except OSError as e:
            # EADDRINUSE: another agent on this host serves it. EADDRNOTAVAIL: not our address.
            if must or e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise UsageError(
                    f"cannot serve the rendezvous store on {format_endpoint(addr, port)}: "
                    f"{e.strerror or e}; pick a free port (or port 0 on a single node)"
                ) from None
            return addr, port
        return addr, self._server.port

    @property
    def _client(self) -> StoreClient:
        if self._client_conn is None:
            with self._connect_lock:
                if self._client_conn is None:
                    self._client_conn = StoreClient(
                        self._connect_host,
                        self._port,
                        self._token,
                        connect_timeout=self.cfg.join_timeout,
                        read_timeout=self.cfg.read_timeout,
                        lazy_verdict=True,
                    )
        return self._client_conn

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()

    @property
    def endpoint(self) -> str:
        """The store's real ``host:port`` (port 0 resolved)."""
        return format_endpoint(self._host_name, self._port)

    @property
    def is_host(self) -> bool:
        return self._server is not None

    # -- keys ----------------------------------------------------------------------------------

    def _k(self, rnd: int, name: str) -> str:
        return f"{self._prefix}{rnd}/{name}"

    @property
    def _closed_key(self) -> str:
        return self._prefix + "closed"

    def _closed_error(self, raw: bytes) -> RendezvousClosedError:
        try:
            d = json.loads(raw)
            return RendezvousClosedError(str(d["reason"]), bool(d["failed"]))
        except (ValueError, KeyError, TypeError):
            return RendezvousClosedError(raw.decode(errors="replace"), True)

    # -- joining -------------------------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it forms (see the module docstring)."""
        try:
            return self._next_rendezvous()
        except StoreAuthError as e:
            raise RendezvousError(str(e)) from None
        except StoreTimeoutError as e:
            raise RendezvousTimeoutError(f"{e}; is the agent at {self.endpoint} running?") from None
        except StoreError as e:
            raise RendezvousClosedError(
                f"lost the rendezvous store at {self.endpoint}: {e}", failed=True
            ) from None

    def _next_rendezvous(self) -> RendezvousInfo:
        cfg, c = self.cfg, self._client
        deadline = time.monotonic() + cfg.join_timeout
        self._leave_round()
        cur_closed = wait_fields([self._prefix + "cur", self._closed_key, HOST_KEY], True, 0)
        first_add: int | None = None
        if self._round < 0:
            # A fresh node nearly always joins round 0: read the hints and join round 0 in one
            # round trip. If round 0 is already sealed (cur > 0), the extra ADD lands on a
            # counter that is >= SEAL for good and changes nothing.
            r_get, r_add = c.pipeline(
                [(Op.WAIT, (cur_closed,)), (Op.ADD, (add_fields(self._k(0, "join"), 1),))]
            )
            cur_raw, closed_raw, host_raw = r_get.values()
            self._check_host(host_raw)
            first_add = r_add.body.i64()
        else:
            cur_raw, closed_raw, _ = c.pipeline([(Op.WAIT, (cur_closed,))])[0].values()
        if closed_raw is not None:
            raise self._closed_error(closed_raw)
        rnd = max(int(cur_raw or 0), self._round + 1)
        if rnd != 0:
            first_add = None
        if rnd > 0 and self._round != rnd - 1:
            # We are new to a running job: if its world has room, make it re-form with us.
            running = c.get(self._k(rnd - 1, "world"))
            if running is not None:
                self._notify_if_room(rnd - 1, _World.parse(rnd - 1, running))
        while True:
            rnd, index = self._join(rnd, deadline, first_add)
            first_add = None
            world = self._await_world(rnd, index, deadline)
            rank = world.rank_of(index)
            if rank >= 0:
                break
            # Sealed without us (we arrived after the seal): try the next round.
            self._release_lease(rnd, index)
            self._notify_if_room(rnd, world)
            rnd += 1
        with self._lock:
            self._round, self._index, self._rank, self._world = rnd, index, rank, world
            self._event = None
        return RendezvousInfo(
            round=rnd,
            group_rank=rank,
            group_world_size=len(world.indices),
            local_world_sizes=world.local_world_sizes,
            addrs=world.addrs,
        )

    def _check_host(self, host_raw: bytes | None) -> None:
        """Refuse, at once, a store served by another job's agent: it stops serving when *its*
        job ends, which would take this job down mid-run (see "One store, one job")."""
        host = host_raw.decode(errors="replace") if host_raw is not None else None
        if host is not None and host != self.params.run_id:
            raise UsageError(
                f"the rendezvous store at {self.endpoint} is served by the agent of another job "
                f"(run id {host!r}), not {self.params.run_id!r}: a store lives only as long as "
                f"its job, so two jobs cannot share an endpoint; give each job its own "
                f"--rdzv-endpoint port (or port 0 / --standalone on a single node)"
            )

    def _join(self, rnd: int, deadline: float, first_add: int | None) -> tuple[int, int]:
        """Take an arrival index in the first round still open at or after ``rnd``
        (``first_add``: the result of an ADD on round ``rnd`` already made)."""
        c, p = self._client, self.params
        while True:
            v = c.add(self._k(rnd, "join"), 1) if first_add is None else first_add
            first_add = None
            if v <= p.max_nodes:
                break
            # Full or sealed: that round runs (or is forming) without us.
            if v >= SEAL:
                vals = c.wait(
                    [self._k(rnd, "world"), self._closed_key],
                    want_all=False,
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                if vals is None:
                    raise RendezvousTimeoutError(self._timeout_msg())
                if vals[1] is not None:
                    raise self._closed_error(vals[1])
                assert vals[0] is not None
                self._notify_if_room(rnd, _World.parse(rnd, vals[0]))
            rnd += 1
        fire = self._lease_message(rnd, v)
        # No need to wait for these two answers: the server applies them before our next request.
        c.post_set(
            self._k(rnd, f"node/{v}"),
            f"{p.local_world_size}\t{self._sortkey}\t{self.addr}".encode(),
        )
        # Owned by this connection: if our agent dies, its socket closes and the peers hear of it
        # at once; a hung agent (socket open, no heartbeats) is dropped after heartbeat_timeout.
        c.post_lease(
            self._k(rnd, f"lease/{v}"),
            self.cfg.heartbeat_timeout,
            self._k(rnd, "stale"),
            fire.encode(),
            fire_on_disconnect=True,
        )
        # And when our connection closes we count as "left" for the host's leave-together wait
        # (finish / close), which then need not sit out its whole timeout for a dead node.
        c.post_lease(
            self._k(rnd, f"finlease/{v}"),
            _NEVER,
            self._k(rnd, f"fin/{v}"),
            b"gone",
            fire_on_disconnect=True,
        )
        with self._lock:
            self._lease = (rnd, v)
            start_beating = not self._beating
            self._beating = True
        if start_beating:
            _HEARTBEATS.add(self, time.monotonic() + self.cfg.heartbeat_interval)
        return rnd, v

    def _notify_if_room(self, rnd: int, world: _World) -> None:
        # A world with room for us restarts to take us in; a full one keeps running (we stand by).
        if len(world.indices) < self.params.max_nodes and not self._static:
            self._client.set(self._k(rnd, "stale"), f"node {self.addr} is waiting to join".encode())

    def _await_world(self, rnd: int, index: int, deadline: float) -> _World:
        c, p, cfg = self._client, self.params, self.cfg
        world_key = self._k(rnd, "world")
        known = index  # the highest arrival count we know of
        if rnd > 0 and not self._await_previous_round_stale(rnd, index, deadline):
            formed = c.get(world_key)
            assert formed is not None
            return _World.parse(rnd, formed)
        if index == p.max_nodes:
            self._try_seal(rnd, deadline)
        stale_key = self._k(rnd, "stale")
        stale_seen = False
        while True:
            remaining = deadline - time.monotonic()
            # stale before the round forms: a node that joined it died. Seal now: the world
            # forms stale, so its members re-form at once without the dead node, instead of
            # waiting forever for a MAX-th node that will never seal.
            keys = [world_key, self._closed_key, self._closed_key if stale_seen else stale_key]
            last_call = False
            if known < p.min_nodes:
                if p.min_nodes < p.max_nodes:  # else the node arriving as number MAX seals
                    keys.append(self._k(rnd, f"node/{p.min_nodes}"))
            elif known < p.max_nodes:
                keys.append(self._k(rnd, f"node/{known + 1}"))
                last_call = True
            timeout = min(cfg.last_call_timeout, remaining) if last_call else remaining
            vals = c.wait(keys, want_all=False, timeout=max(0.0, timeout))
            if vals is None:
                if last_call:
                    # The last call ran out (or join_timeout did, with MIN already here: then
                    # form what we have rather than fail).
                    self._try_seal(rnd, deadline)
                    known = p.max_nodes
                    continue
                self._withdraw(rnd, index)
                raise RendezvousTimeoutError(self._timeout_msg())
            if vals[1] is not None:
                raise self._closed_error(vals[1])
            if vals[0] is not None:
                return _World.parse(rnd, vals[0])
            if vals[2] is not None and not stale_seen:
                self._try_seal(rnd, deadline)
                known = p.max_nodes  # sealed now, by us or another: wait for the world
                stale_seen = True
                continue
            count = c.add(self._k(rnd, "join"), 0)
            known = p.max_nodes if count >= SEAL else max(known + 1, min(count, p.max_nodes))

    def _await_previous_round_stale(self, rnd: int, index: int, deadline: float) -> bool:
        """Round ``rnd`` may form only once round ``rnd - 1`` is stale: otherwise nodes standing
        by while a full world runs would form a second world of the same job (split brain).
        True when the gate opened; False when ``rnd``'s world formed meanwhile."""
        vals = self._client.wait(
            [self._k(rnd - 1, "stale"), self._k(rnd, "world"), self._closed_key],
            want_all=False,
            timeout=max(0.0, deadline - time.monotonic()),
        )
        if vals is None:
            self._withdraw(rnd, index)
            raise RendezvousTimeoutError(
                f"rendezvous {self.params.run_id!r} at {self.endpoint}: the running round is full "
                f"({self.params.max_nodes} nodes) and this node stood by for join_timeout="
                f"{self.cfg.join_timeout:g}s without a slot opening; raise --nnodes MAX to use it"
            )
        if vals[2] is not None:
            raise self._closed_error(vals[2])
        return vals[1] is None

    def _withdraw(self, rnd: int, index: int) -> None:
        # An empty node entry tells a later sealer to leave us out.
        self._client.set(self._k(rnd, f"node/{index}"), b"")
        self._release_lease(rnd, index)

    def _try_seal(self, rnd: int, deadline: float) -> None:
        c, p = self._client, self.params
        v = c.add(self._k(rnd, "join"), SEAL)
        if not SEAL <= v < 2 * SEAL:
            return  # someone else sealed it
        n = min(v - SEAL, p.max_nodes)
        keys = [self._k(rnd, f"node/{i}") for i in range(1, n + 1)]
        # Every counted node sets its key right after its ADD; wait briefly for stragglers.
        vals = c.wait(
            keys, timeout=min(self.cfg.read_timeout, max(0.0, deadline - time.monotonic()))
        )
        if vals is None:
            vals = c.multi_get(keys)
        members: list[tuple[str, str, int, int]] = []
        for i, raw in enumerate(vals, start=1):
            if not raw:
                continue  # died between ADD and SET, or withdrew: leave it out
            nproc, sortkey, addr = raw.decode().split("\t", 2)
            members.append((addr, sortkey, i, int(nproc)))
        if self._static:
            members.sort(key=lambda m: m[1])
            ranks = [int(m[1]) for m in members]
            if ranks != list(range(p.max_nodes)):
                reason = (
                    f"static rendezvous: node ranks {ranks} are not exactly 0..{p.max_nodes - 1}; "
                    f"give every node a distinct --node-rank below --nnodes"
                )
                c.set(self._closed_key, json.dumps({"failed": True, "reason": reason}).encode())
                return
        else:
            members.sort()
        # world first: whoever reads cur = r + 1 finds round r formed.
        c.post_set(self._k(rnd, "world"), _World.encode(members))
        c.set(self._prefix + "cur", str(rnd + 1).encode())

    def _timeout_msg(self) -> str:
        p = self.params
        return (
            f"rendezvous {p.run_id!r} at {self.endpoint}: fewer than {p.min_nodes} node(s) joined "
            f"within join_timeout={self.cfg.join_timeout:g}s; start the other nodes, check that "
            f"they use the same endpoint and run id, or raise --rdzv-conf join_timeout"
        )

    # -- leases & heartbeats -------------------------------------------------------------------

    _lease: tuple[int, int] | None = None
    _beating = False

    def _lease_message(self, rnd: int, index: int) -> str:
        return (
            f"node {self.addr} (round {rnd}, arrival {index}) is gone: its connection closed or "
            f"it missed heartbeats for {self.cfg.heartbeat_timeout:g}s"
        )

    def _release_lease(self, rnd: int, index: int) -> None:
        releases = [
            (Op.LEASE, (lease_fields(self._k(rnd, f"lease/{index}"), 0, "", b""),)),
            (Op.LEASE, (lease_fields(self._k(rnd, f"finlease/{index}"), 0, "", b""),)),
        ]
        with self._lock:
            if self._lease != (rnd, index):
                return
            self._lease = None
            if self._watch is not None:
                # Heartbeats travel on the watch connection: release there too, so that the
                # server cannot apply a renewal sent just before after the release, revive the
                # lease and later mark a round that we left as stale.
                with contextlib.suppress(OSError):
                    self._watch.send(b"".join(encode_request(0, op, *f) for op, f in releases))
                    return
        with contextlib.suppress(StoreError):
            self._client.pipeline(releases)

    def _leave_round(self) -> None:
        if self._lease is not None:
            self._release_lease(*self._lease)

    def _beat(self) -> float | None:
        """Renew our lease (fire-and-forget on the watch connection); next due time or None."""
        with self._lock:
            if self._shut:
                return None
            if self._lease is None:
                return time.monotonic() + self.cfg.heartbeat_interval
            rnd, index = self._lease
            try:
                conn = self._watch_conn()
                fire = self._lease_message(rnd, index)
                conn.send(
                    encode_request(
                        0,
                        Op.LEASE,
                        lease_fields(
                            self._k(rnd, f"lease/{index}"),
                            self.cfg.heartbeat_timeout,
                            self._k(rnd, "stale"),
                            fire.encode(),
                        ),
                    )
                )
            except (StoreError, OSError) as e:
                # The store is gone (its host died): the watch fd reports that to the agent.
                log.warning(
                    "rendezvous heartbeat to %s failed, stopping them: %s", self.endpoint, e
                )
                self._beating = False
                return None
        return time.monotonic() + self.cfg.heartbeat_interval

    # -- watching the round --------------------------------------------------------------------

    def _watch_conn(self) -> Connection:
        """The second connection: round watch + heartbeats (caller holds self._lock)."""
        if self._watch is None:
            self._watch = Connection.open(
                self._connect_host,
                self._port,
                self._token,
                deadline=time.monotonic() + self.cfg.read_timeout,
                read_timeout=self.cfg.read_timeout,
            )
        return self._watch

    def _arm(self) -> Connection:
        """Make sure a WAIT any(stale, closed) for the current round is pending (lock held)."""
        conn = self._watch_conn()
        if self._armed_for != self._round:
            self._watch_rid += 1
            keys = (
                [self._k(self._round, "stale"), self._closed_key]
                if self._round >= 0
                else [self._closed_key]
            )
            conn.send(encode_request(self._watch_rid, Op.WAIT, wait_fields(keys, False, None)))
            self._armed_rid, self._armed_for = self._watch_rid, self._round
        return conn

    def fileno(self) -> int:
        """Readable as soon as the current round is stale or the job closed (see poll_event)."""
        with self._lock:
            try:
                return self._arm().sock.fileno()
            except (StoreError, OSError) as e:
                raise RendezvousClosedError(
                    f"lost the rendezvous store at {self.endpoint}: {e}"
                ) from None

    @property
    def closed_failed(self) -> bool:
        """After ``poll_event`` returned CLOSED: did the job fail (a peer gave up, the store was
        lost) rather than finish? The agent exits 1 with the reason for the first, 0 for the
        second."""
        return self._closed_failed

    def poll_event(self) -> tuple[RendezvousEvent, str] | None:
        """Non-blocking: (CLOSED, reason) / (RESTART, reason) / None; drains ``fileno()``.
        For CLOSED, ``closed_failed`` tells a failed job from a finished one."""
        with self._lock:
            if self._event is not None:
                return self._event
            try:
                conn = self._arm()
                # Stop at the answer: the store may close right behind a verdict, and reading
                # on would turn "the job finished / failed because ..." into "lost the store".
                while self._event is None and conn.readable():
                    resp = conn.recv_response()
                    if resp.rid != self._armed_rid or resp.status != Status.OK:
                        continue  # the answer to a previous round's watch
                    stale, closed = (
                        resp.values()[-2:] if self._round >= 0 else (None, resp.values()[0])
                    )
                    if closed is not None:
                        err = self._closed_error(closed)
                        self._closed_failed = err.failed
                        self._event = (RendezvousEvent.CLOSED, err.reason)
                    elif stale is not None:
                        self._event = (RendezvousEvent.RESTART, stale.decode(errors="replace"))
            except (StoreError, OSError, ConnectionError) as e:
                self._closed_failed = True
                self._event = (
                    RendezvousEvent.CLOSED,
                    f"lost the rendezvous store at {self.endpoint}: {e}",
                )
            return self._event

    # -- leaving -------------------------------------------------------------------------------

    def request_restart(self, reason: str) -> None:
        """A local worker failed; every node of the round (this one too) sees RESTART."""
        if self._round < 0:
            return
        with contextlib.suppress(StoreError):
            self._client.set(self._k(self._round, "stale"), f"node {self.addr}: {reason}".encode())

    def close(self, failed: bool, reason: str) -> None:
        """This node gives up: every peer sees CLOSED (and next_rendezvous raises it)."""
        self._closed = True
        self._leave_round()
        with contextlib.suppress(StoreError):
            self._client.set(
                self._closed_key,
                json.dumps({"failed": failed, "reason": f"node {self.addr}: {reason}"}).encode(),
            )

    def finish(self, timeout: float | None = None) -> list[str]:
        """Our workers all succeeded. The store's host waits (<= ``timeout``, default conf
        ``exit_barrier_timeout``) for the round's other nodes to finish or leave before it may
        shut the store down: "leave together". Then it closes the job: not failed when every
        node finished, failed (naming the others) if not, so that a node still running, or
        re-forming after a late failure, stops rather than waiting for a store that is about
        to go away. Returns the addresses of the nodes that did not finish (host only)."""
        self._finished = True
        self._leave_round()
        world = self._world
        if self._round < 0 or world is None:
            return []
        if timeout is None:
            timeout = self.cfg.exit_barrier_timeout
        unfinished: list[str] = []
        with contextlib.suppress(StoreError):
            self._client.set(self._k(self._round, f"fin/{self._index}"), b"done")
            if self._server is None:
                return []
            fins = self._wait_fin(timeout)
            unfinished = [a for a, v in zip(world.addrs, fins, strict=True) if v != b"done"]
            if unfinished:
                self._closed = True  # shutdown keeps serving (close_timeout) so they read why
                verdict = {
                    "failed": True,
                    "reason": f"node {self.addr} finished, but {', '.join(unfinished)} did not "
                    f"finish within exit_barrier_timeout={timeout:g}s (or left without finishing); if "
                    f"nodes legitimately finish further apart, raise --rdzv-conf "
                    f"exit_barrier_timeout",
                }
            else:
                verdict = {"failed": False, "reason": "the job finished"}
            self._client.set(self._closed_key, json.dumps(verdict).encode())
        return unfinished

    def _wait_fin(self, timeout: float) -> list[bytes | None]:
        """Wait until every member of the round has left; each one's ``fin`` value."""
        assert self._world is not None
        keys = [self._k(self._round, f"fin/{i}") for i in self._world.indices]
        return self._client.wait(keys, timeout=timeout) or self._client.multi_get(keys)

    def kv(self) -> KeyValue:
        """The agent's keys. They travel on a connection of their own, so that a blocking
        ``get`` never holds up this handler's rendezvous calls (or a ``set`` from another thread
        of the same agent)."""
        with self._lock:
            if self._kv is None:
                try:
                    client = StoreClient(
                        self._connect_host,
                        self._port,
                        self._token,
                        connect_timeout=self.cfg.read_timeout,
                        read_timeout=self.cfg.read_timeout,
                    )
                except StoreError as e:
                    raise RendezvousClosedError(
                        f"lost the rendezvous store at {self.endpoint}: {e}"
                    ) from None
                self._kv = KeyValue(client, self.params.run_id)
            return self._kv

    def shutdown(self) -> None:
        """Stop heartbeats, close sockets, stop the store if this node serves it; idempotent."""
        if self._shut:
            return
        if self._round >= 0 and not (self._finished or self._closed):
            # Leaving mid-round without close/finish: let the peers re-form at once.
            self.request_restart("left the rendezvous")
        self._leave_round()
        if self._round >= 0:
            with contextlib.suppress(StoreError):
                self._client.set(self._k(self._round, f"fin/{self._index}"), b"done")
                if self._server is not None and self._closed:
                    # Keep serving until the peers have read the verdict (or close_timeout).
                    self._wait_fin(self.cfg.close_timeout)
        with self._lock:
            self._shut = True
            if self._watch is not None:
                self._watch.close()
            if self._kv is not None:
                self._kv.close()
        if self._client_conn is not None:
            self._client_conn.close()
        self._stop_server()

    def __enter__(self) -> RendezvousHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def create_handler(params: RendezvousParams) -> RendezvousHandler:
    """Validate ``params`` (UsageError on a user mistake) and build the handler."""
    p = params
    if p.backend not in RDZV_BACKENDS:
        raise UsageError(
            f"rendezvous backend {p.backend!r} is not supported; use one of {', '.join(RDZV_BACKENDS)}"
        )
    if not p.run_id or "/" in p.run_id:
        raise UsageError(f"rendezvous run id {p.run_id!r} must be non-empty and without '/'")
    if not 1 <= p.min_nodes <= p.max_nodes:
        raise UsageError(
            f"--nnodes {p.min_nodes}:{p.max_nodes} is invalid; expected 1 <= MIN <= MAX, e.g. 2:4"
        )
    if p.local_world_size < 1:
        raise UsageError(f"nproc per node {p.local_world_size} must be >= 1")
    if p.backend == "static":
        if p.min_nodes != p.max_nodes:
            raise UsageError(
                f"the static rendezvous needs a fixed --nnodes, got {p.min_nodes}:{p.max_nodes}; "
                f"use --rdzv-backend c10d for an elastic range"
            )
        if not 0 <= p.node_rank < p.max_nodes:
            raise UsageError(
                f"--node-rank {p.node_rank} is out of range for --nnodes {p.max_nodes}; "
                f"expected 0..{p.max_nodes - 1}"
            )
    parse_endpoint(p.endpoint)
    cfg = config_from_conf(p.conf)
    token = load_token(cfg)
    if token is None and p.private_store:
        token = os.urandom(32)
    return RendezvousHandler(p, cfg, token)
