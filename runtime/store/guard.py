"""Who may speak torch's TCPStore protocol to the agent's store: the job's own nodes, and on a
node, the job's own user.

torch's protocol has no authentication (torch's own store serves anyone who reaches the port);
xrun's protocol does (HMAC, see ``session.py``). So a torch connection is admitted by where it
comes from, checked once, when its first bytes choose the protocol (``server.StoreServer._admit``):

- from another host: only from an address that an *authenticated* agent of this job is
  connected from right now (an xrun-protocol session that proved the job's secret: the
  rendezvous members, whatever the backend, static node lists included);
- from this host (a loopback address, or the address the connection came in on): only from a
  socket owned by the agent's own user, read from the kernel's socket table
  (``/proc/net/tcp``, ``/proc/net/tcp6``: the peer socket's ``uid``). A socket that cannot be
  found there (another network namespace) is refused too: its owner is unknown.

A refused connection is closed at once. The first few are logged one line each (the peer and the
reason), then at most one line a minute counts the rest (``throttle.py``): any local user can
open thousands of connections a second, and must not grow the job's log with them. Linux only:
elsewhere (no ``/proc/net``) local peers are not checked (logged once).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..lazylog import LazyLogger
from ..throttle import Throttle
from .handler import XrunHandler

if TYPE_CHECKING:
    from .loop import Transport

log = LazyLogger(__name__)
_TABLES: dict[int, str] = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}
_warned_no_proc = False
_TIME_WAIT = "06"  # the kernel's TCP_TIME_WAIT, as /proc/net/tcp prints a row's state
# One per process (an agent runs one store): the refusals' log lines, rate-limited.
REFUSALS = Throttle(
    "store: refused {n} more torch clients (other users or hosts) in the last {s} s"
)


def refused(transport: Transport, sessions: Iterable[object]) -> bool:
    """Whether the torch-protocol connection on ``transport`` is refused (logged in one line);
    ``sessions``: the store's open connections (its authenticated agents among them)."""
    sock = transport.get_extra_info("socket")
    agents = []
    for s in sessions:
        handler = getattr(s, "handler", None)
        theirs = getattr(s, "transport", None)
        if isinstance(handler, XrunHandler) and handler.trusted and theirs is not None:
            try:
                agents.append(theirs.get_extra_info("socket").getpeername()[0])
            except OSError:
                continue
    why = refusal(sock, agents)
    if why is not None:
        try:
            peer = sock.getpeername()[:2]
        except OSError:
            peer = "?"
        line = REFUSALS.line(f"store: refused a torch client from {peer}: {why}")
        if line is not None:
            log.warning("%s", line)
    return why is not None


def flush() -> None:
    """Log the count of refusals not logged yet (the store stops)."""
    line = REFUSALS.flush()
    if line is not None:
        log.warning("%s", line)


def refusal(sock: socket.socket, agent_peers: Iterable[str]) -> str | None:
    """Why the torch-protocol connection on ``sock`` is refused; None when it is admitted.
    ``agent_peers``: the addresses the job's authenticated agents are connected from."""
    try:
        peer = sock.getpeername()
        local = sock.getsockname()
    except OSError as e:
        return f"its address is unknown ({e.strerror or e})"
    import ipaddress  # benchmark 1: only with the first torch client, not at start-up

    host = _plain(peer[0])
    if _plain(local[0]) == host or ipaddress.ip_address(host).is_loopback:
        uid = peer_uid(sock.family, peer, local)
        if uid is None:
            return _unknown_owner()
        if uid != os.getuid():
            return f"it is another user's (uid {uid}; the job's is {os.getuid()})"
        return None
    if host in {_plain(p) for p in agent_peers}:
        return None
    return "it comes from no node of this job (no authenticated agent connects from there)"


def _plain(addr: str) -> str:
    """An address as one spelling: IPv4-mapped IPv6 as IPv4, no zone."""
    import ipaddress  # benchmark 1: as above

    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _unknown_owner() -> str | None:
    global _warned_no_proc
    if os.path.isdir("/proc/net"):
        return "its owner is not in this host's socket table (another network namespace?)"
    if not _warned_no_proc:
        _warned_no_proc = True
        log.warning("store: no /proc/net here: local torch clients are not checked by user")
    return None


def peer_uid(family: int, peer: tuple[object, ...], local: tuple[object, ...]) -> int | None:
    """The uid owning the peer's end of a local TCP connection (its socket's row in
    ``/proc/net/tcp{,6}``: local address = the peer's, remote = ours); None when not found.
    Both tables: an IPv6 client (torch's is) reaches an IPv4 listener as ``::ffff:a.b.c.d``."""
    ends = [(str(peer[0]), int(str(peer[1]))), (str(local[0]), int(str(local[1])))]
    for _ in range(2):  # once more before "not found": the table changes while it is read
        uid = _find_uid(ends)
        if uid is not None:
            return uid
    return None


def _find_uid(ends: list[tuple[str, int]]) -> int | None:
    for fam, table in _TABLES.items():
        try:
            want = tuple(_proc_addr(fam, addr, port) for addr, port in ends)
        except (OSError, ValueError):
            continue  # an address this family cannot spell
        try:
            text = _read_table(table)
        except OSError:
            continue
        for line in text.splitlines()[1:]:  # after the header
            fields = line.split()
            # a TIME_WAIT row (st 06) is an earlier connection's ghost on the same ports,
            # owned by no one (uid 0): never the live client's socket
            if len(fields) > 7 and (fields[1], fields[2]) == want and fields[3] != _TIME_WAIT:
                return int(fields[7])
    return None


# The socket tables, opened once and read again from offset 0 each time: a store out of file
# descriptors (EMFILE) must still tell who a new client is (the kernel regenerates the text).
_table_fds: dict[str, int] = {}


def prepare() -> None:
    """Open the socket tables and load what checks a client now (the store's warm-up, before
    the workers connect), while descriptors are to be had: a store out of them (EMFILE) can
    neither open a file nor import a module."""
    import ipaddress  # benchmark 1: loaded in the store's warm-up, off the start-up path

    del ipaddress
    for table in _TABLES.values():
        if table not in _table_fds:
            try:
                _table_fds[table] = os.open(table, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # not Linux, or no IPv6: peer_uid tries again, then says unknown


def _read_table(table: str) -> str:
    fd = _table_fds.get(table)
    if fd is None:
        prepare()
        fd = _table_fds.get(table)
        if fd is None:
            raise OSError(f"cannot open {table}")
    chunks: list[bytes] = []
    offset = 0
    while True:
        # One large read where it can be: the kernel makes the text a record at a time, and a
        # table read in pieces can skip a row when sockets close between the pieces (a busy
        # host has thousands of TIME_WAIT rows).
        chunk = os.pread(fd, 1 << 22, offset)
        if not chunk:
            return b"".join(chunks).decode("ascii", "replace")
        chunks.append(chunk)
        offset += len(chunk)


def _proc_addr(family: int, addr: str, port: int) -> str:
    """``addr:port`` as the kernel prints it: each 32-bit word of the address in host
    (little-endian) order, in hex, then the port in hex."""
    addr = _plain(addr)
    if family == socket.AF_INET6 and "." in addr:
        addr = f"::ffff:{addr}"
    raw = socket.inet_pton(family, addr)
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"
