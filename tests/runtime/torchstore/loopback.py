"""A tiny loopback server for the tests: one thread, ``selectors``, the codec and handler over
a DictKeySpace. Test code, not production (the store wing has the real server).

``python -m tests.runtime.torchstore.loopback`` runs one in its own process and prints
``PORT <n>``: the tests that drive torch's real client need that, because some of its binding's
blocking calls (queue_len, queue_pop, list_keys, ...) keep the GIL, which would freeze a server
thread in the client's process. It exits when its stdin closes. Each dropped connection's reason goes to stderr as
``DROPPED <reason>``.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import threading
from dataclasses import dataclass, field

from tests.runtime.torchstore.dictspace import DictKeySpace
from xrun.runtime.torchstore.codec import DEFAULT_LIMITS, Limits, ProtocolError
from xrun.runtime.torchstore.handler import TorchStoreService, TorchStoreSession


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    session: TorchStoreSession | None = None
    out: bytearray = field(default_factory=bytearray)


class LoopbackServer:
    """``with LoopbackServer() as server: ... server.port ...``"""

    def __init__(self, limits: Limits | None = None, *, quiet: bool = True) -> None:
        self.space = DictKeySpace()
        self.service = TorchStoreService(self.space, limits or DEFAULT_LIMITS)
        self.dropped: list[str] = []
        self.conns: set[_Conn] = set()
        self._quiet = quiet
        self._sel = selectors.DefaultSelector()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._stop_r, self._stop_w = socket.socketpair()
        self._sel.register(self._stop_r, selectors.EVENT_READ, "stop")
        self._thread = threading.Thread(target=self.serve, name="torchstore-loopback", daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_w.send(b"x")
        self._thread.join(10)
        for conn in list(self.conns):
            self._close(conn)
        self._sel.close()
        self._listener.close()
        self._stop_r.close()
        self._stop_w.close()

    def serve(self) -> None:
        while True:
            for key, events in self._sel.select():
                if key.data == "stop":
                    return
                if key.data is None:
                    self._accept()
                elif events & selectors.EVENT_READ:
                    self._read(key.data)
                else:
                    self._flush(key.data)

    def _accept(self) -> None:
        sock, _ = self._listener.accept()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        conn.session = self.service.session(lambda data: self._write(conn, data))
        self.conns.add(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(256 << 10)
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        assert conn.session is not None
        try:
            conn.session.feed(data)
        except ProtocolError as e:
            self._drop(conn, str(e))

    def _write(self, conn: _Conn, data: bytes) -> None:
        if conn not in self.conns:
            return
        if not conn.out:
            try:
                sent = conn.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close(conn)
                return
            data = data[sent:]
            if not data:
                return
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        conn.out += data

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except OSError:
            self._close(conn)
            return
        del conn.out[:sent]
        if not conn.out:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn, reason: str) -> None:
        self.dropped.append(reason)
        if not self._quiet:
            print(f"DROPPED {reason}", file=sys.stderr, flush=True)
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        if conn.session is not None:
            conn.session.close()
        self._sel.unregister(conn.sock)
        conn.sock.close()


def main() -> None:
    server = LoopbackServer(quiet=False)
    # The parent closes our stdin (or dies): stop, so no server outlives its test.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    print(f"PORT {server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
