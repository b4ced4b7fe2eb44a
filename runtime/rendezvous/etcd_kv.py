"""``EtcdClient``: the few etcd v3 calls the etcd rendezvous needs, over etcd's HTTP/JSON gateway
(``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/lease/*``, ``/v3/watch``) with ``http.client``.

Standard library only: the agent must run in a python3-only image, so no etcd client library
(and no grpc). Keys and values travel base64-encoded, numbers (revisions, lease ids) as decimal
strings, as the gateway's JSON mapping of etcd's protobufs has it.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xrun.errors import UsageError

__all__ = ["EtcdClient", "EtcdError", "Entry", "prefix_end", "tls_context"]


class EtcdError(Exception):
    """etcd could not be reached, or answered with an error."""


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    mod_revision: int


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    b = bytearray(prefix.encode())
    b[-1] += 1
    return b.decode()


class EtcdClient:
    """Blocking calls to one etcd member at ``host:port``; one kept-alive HTTP connection per
    thread (``http.client`` connections are not thread-safe). ``timeout`` bounds every call but
    ``wait_change``, which is bounded by its own argument."""

    def __init__(
        self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._tls = tls  # https (conf protocol=https) when given
        self._local = threading.local()

    def _open(self) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self._tls
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    @property
    def where(self) -> str:
        return f"etcd at {self.host}:{self.port}"

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
        return conn

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path``; the decoded answer. A kept-alive connection the server
        closed meanwhile is reopened once (a request that never arrived is safe to resend)."""
        data = json.dumps(body)
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request("POST", path, data, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                conn.close()
                self._local.conn = None
                if attempt == 0:
                    continue
                raise EtcdError(f"{self.where} closed the connection: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                self._local.conn = None
                raise EtcdError(f"cannot reach {self.where}: {e}") from None
            return self._decode(path, resp.status, raw)
        raise AssertionError("unreachable")

    def _decode(self, path: str, status: int, raw: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = None
        if status != 200 or not isinstance(doc, dict):
            text = raw[:200].decode(errors="replace").strip()
            if status == 404 or not isinstance(doc, dict):
                raise EtcdError(
                    f"{self.host}:{self.port} is not an etcd v3 server (POST {path}: HTTP "
                    f"{status} {text[:80]!r})"
                )
            raise EtcdError(f"{self.where}: POST {path}: HTTP {status}: {doc.get('message', text)}")
        return doc

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- keys --------------------------------------------------------------------------------

    def get_prefix(self, prefix: str) -> tuple[int, list[Entry]]:
        """(the store's revision, every key under ``prefix``)."""
        doc = self.call(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        )
        return int(doc["header"]["revision"]), [_kv(d) for d in doc.get("kvs", [])]

    def get(self, key: str) -> Entry | None:
        """``key``'s entry, None when it is not set."""
        kvs = self.call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self.call("/v3/kv/put", body)

    def put_if(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        """Compare-and-set: write ``key`` only if it was last written at ``mod_revision`` (0:
        only if it does not exist). Whether it was written."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        doc = self.call(
            "/v3/kv/txn",
            {
                "compare": [
                    {
                        "key": _b64(key),
                        "target": "MOD",
                        "result": "EQUAL",
                        "mod_revision": str(mod_revision),
                    }
                ],
                "success": [{"request_put": put}],
            },
        )
        return bool(doc.get("succeeded", False))

    # -- leases ------------------------------------------------------------------------------

    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        return int(self.call("/v3/lease/grant", {"TTL": str(ttl)})["ID"])

    def keep_alive(self, lease: int) -> bool:
        """Renew ``lease``; False when it has expired already (its keys are gone)."""
        doc = self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(doc.get("result", {}).get("TTL", 0)) > 0

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: its keys go at once (a clean exit is seen without a TTL's wait)."""
        self.call("/v3/lease/revoke", {"ID": str(lease)})

    # -- watching ----------------------------------------------------------------------------

    def wait_change(self, prefix: str, after: int, timeout: float) -> bool:
        """Block until a key under ``prefix`` changes after revision ``after`` (True), or
        ``timeout`` passes (False). A watch of its own, on a connection of its own: closing it
        cancels the watch."""
        deadline = time.monotonic() + timeout
        conn = self._open()
        try:
            body = {
                "create_request": {
                    "key": _b64(prefix),
                    "range_end": _b64(prefix_end(prefix)),
                    "start_revision": str(after + 1),
                }
            }
            conn.request("POST", "/v3/watch", json.dumps(body))
            resp = conn.getresponse()
            if resp.status != 200:
                self._decode("/v3/watch", resp.status, resp.read())
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                assert conn.sock is not None
                conn.sock.settimeout(left)
                line = resp.readline()
                if not line:
                    raise EtcdError(f"{self.where} ended a watch")
                result = json.loads(line).get("result", {})
                # The first message only confirms the watch; a compacted start revision or an
                # event both mean: read again.
                if result.get("events") or result.get("compact_revision") or result.get("canceled"):
                    return True
        except TimeoutError:
            return False
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise EtcdError(f"lost the watch on {self.where}: {e}") from None
        finally:
            conn.close()


def _kv(d: dict[str, Any]) -> Entry:
    return Entry(
        base64.b64decode(d["key"]).decode(),
        base64.b64decode(d.get("value", "")),
        int(d.get("mod_revision", 0)),
    )


def tls_context(conf: Mapping[str, str]) -> ssl.SSLContext | None:
    """conf ``protocol=https``: the TLS context, from torchrun's keys (``etcd-v2``'s ``ca_cert``,
    ``ssl_cert``, ``ssl_cert_key``, or ``etcd``'s ``cacert``, ``cert``, ``key``); None for http."""
    protocol = conf.get("protocol", "http").strip().lower()
    if protocol == "http":
        return None
    if protocol != "https":
        raise UsageError(
            f"--rdzv-conf protocol={protocol[:20]!r} is not http or https; write protocol=http "
            f"(the default) or protocol=https"
        )
    ca = conf.get("ca_cert") or conf.get("cacert")
    cert = conf.get("ssl_cert") or conf.get("cert")
    key = conf.get("ssl_cert_key") or conf.get("key")
    try:
        ctx = ssl.create_default_context(cafile=ca)  # None: the system's CAs
        if cert:
            ctx.load_cert_chain(cert, key)
        elif key:
            raise UsageError(
                "--rdzv-conf ssl_cert_key (key) without ssl_cert (cert): give the client "
                "certificate too, or neither"
            )
    except (OSError, ssl.SSLError) as e:
        raise UsageError(
            f"--rdzv-conf protocol=https: cannot load the TLS files (ca_cert={ca!r}, "
            f"ssl_cert={cert!r}, ssl_cert_key={key!r}): {e}; point them at readable PEM files"
        ) from None
    return ctx
