"""Rendezvous endpoints: ``Endpoint``, the one parser and formatter of ``host:port``, and the
addresses a node binds and advertises.

An endpoint is parsed once, where it enters (the command line in ``args.py``, a
``LaunchConfig`` built in Python), and travels as an ``Endpoint`` from there: the agent, the
handler and the store link read its fields, never the text again.
"""

from __future__ import annotations

import socket

from xrun.contract import RDZV_ENDPOINT_DEFAULT_PORT
from xrun.errors import UsageError
from xrun.limits import capped_int, is_digits, shown
from xrun.record import Value

from ..store.client import is_ip_literal

__all__ = [
    "Endpoint",
    "bind_address",
    "default_local_addr",
    "unbracket",
]

_FORM = "expected HOST, HOST:PORT or [IPV6]:PORT, e.g. node0:29400"


class Endpoint(Value):
    """Where the rendezvous store is: ``host`` as written (an IPv6 address without brackets)
    and ``port`` (0: a free one, picked by the agent that serves the store). ``str()`` gives
    the text form, which ``parse`` reads back. A value (:class:`xrun.record.Value`), not a
    frozen dataclass: making one costs the agent's start-up (benchmark 1) about half a
    millisecond."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, default_port: int = RDZV_ENDPOINT_DEFAULT_PORT) -> Endpoint:
        """``host:port`` / ``[v6]:port`` / ``host`` / ``[v6]`` / ``v6`` -> an Endpoint; a
        UsageError naming the text and the expected form otherwise.

        A bare IPv6 address (``::1``) gets the default port; it must be a whole, valid address,
        since a port after it (``::1:29400``) could not be told from the address: such an
        endpoint is refused with the bracketed form to write instead.
        """
        ep = text.strip()
        if ep.startswith("["):
            host, sep, rest = ep[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise UsageError(f"rendezvous endpoint {text!r} is malformed; {_FORM}")
            port_s = rest[1:] if rest else ""
        elif ep.count(":") == 1:
            host, _, port_s = ep.partition(":")
        elif ":" in ep and not is_ip_literal(ep):
            raise UsageError(
                f"rendezvous endpoint {text!r} is not an IPv6 address, and an IPv6 address with "
                f"a port needs brackets: write [IPV6]:PORT, e.g. [::1]:29400"
            )
        else:  # bare host name, or a bare IPv6 address
            host, port_s = ep, ""
        if not host:
            raise UsageError(f"rendezvous endpoint {text!r} has no host; {_FORM}")
        if not port_s:
            return cls(host, default_port)
        port = capped_int(port_s, 65535) if is_digits(port_s) else -1
        if not 0 <= port <= 65535:
            raise UsageError(
                f"rendezvous endpoint {shown(text)} has port {shown(port_s)}, expected "
                f"0..65535; {_FORM}"
            )
        return cls(host, port)

    def __str__(self) -> str:
        """``host:port``, with an IPv6 address in brackets (``[::1]:29400``)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def unbracket(host: str) -> str:
    """``::1`` for ``[::1]``; any other host unchanged."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


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
