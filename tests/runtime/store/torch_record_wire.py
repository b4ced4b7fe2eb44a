"""Record the bytes torch's TCPStore client and server exchange, call by call (a research tool).

Run it with the venv's Python: it starts torch's own TCPStore server (libuv backend unless
``--legacy``), puts a loopback man-in-the-middle proxy in front of it, drives a
``TCPStore(is_master=False)`` client through every method of the Python binding, and prints
each chunk that crossed the proxy under the name of the call that caused it. The output is the
ground truth behind docs/torch-tcpstore-protocol.md; it is not a test (nothing is asserted).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

# The proxy runs in its own process: several binding methods (queue_len, queue_pop, list_keys,
# barrier) block on the socket while holding the GIL, which would starve a proxy thread.
_label = ["connect"]
_log: list[tuple[str, str, bytes]] = []
_lock = threading.Lock()


def _pump(src: socket.socket, dst: socket.socket, direction: str) -> None:
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        with _lock:
            _log.append((_label[0], direction, data))
        dst.sendall(data)


def _proxy_process(control: Connection) -> None:
    """Serve as the proxy; `control` gets (label) messages and answers with the log so far."""
    listener = socket.create_server(("127.0.0.1", 0))
    upstream_port = control.recv()
    threading.Thread(target=_proxy, args=(listener, upstream_port), daemon=True).start()
    control.send(listener.getsockname()[1])
    while True:
        label = control.recv()
        time.sleep(0.3)  # let the previous call's last bytes cross
        with _lock:
            control.send(list(_log))
            _log.clear()
            _label[0] = label


def _proxy(listener: socket.socket, upstream_port: int) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", upstream_port))
        threading.Thread(target=_pump, args=(client, server, "c->s"), daemon=True).start()
        threading.Thread(target=_pump, args=(server, client, "s->c"), daemon=True).start()


def _calls(store: Any, other: Any) -> list[tuple[str, Callable[[], Any]]]:
    short = datetime.timedelta(milliseconds=300)
    return [
        ("set", lambda: store.set("k", "v1")),
        ("get", lambda: store.get("k")),
        ("add", lambda: store.add("n", 5)),
        ("add-again", lambda: store.add("n", -2)),
        ("compare_set-match", lambda: store.compare_set("k", "v1", "v2")),
        ("compare_set-mismatch", lambda: store.compare_set("k", "zz", "v3")),
        ("compare_set-missing-empty", lambda: store.compare_set("c", "", "new")),
        ("compare_set-missing-nonempty", lambda: store.compare_set("d", "x", "y")),
        ("check-ready", lambda: store.check(["k", "n"])),
        ("check-notready", lambda: store.check(["k", "nope"])),
        ("wait-present", lambda: store.wait(["k"])),
        ("wait-timeout", lambda: store.wait(["absent"], short)),
        ("num_keys", lambda: store.num_keys()),
        ("delete_key-present", lambda: store.delete_key("c")),
        ("delete_key-missing", lambda: store.delete_key("c")),
        ("append", lambda: store.append("k", "++")),
        ("append-new", lambda: store.append("fresh", "ab")),
        ("multi_set", lambda: store.multi_set(["m1", "m2"], ["x", "yy"])),
        ("multi_get", lambda: store.multi_get(["m1", "m2"])),
        ("queue_push", lambda: store.queue_push("q", "item")),
        ("queue_len", lambda: store.queue_len("q")),
        ("queue_pop", lambda: store.queue_pop("q")),
        ("queue_pop-nonblocking-empty", lambda: store.queue_pop("q", False)),
        ("list_keys", lambda: store.list_keys()),
        ("barrier-1", lambda: store.barrier("b", 1)),
        ("barrier-timeout", lambda: store.barrier("b2", 2, short)),
        ("get-late", lambda: _late_get(store, other)),
        ("set-empty", lambda: store.set("e", "")),
        ("get-empty", lambda: store.get("e")),
    ]


def _late_get(store: Any, other: Any) -> bytes:
    threading.Timer(0.3, lambda: other.set("late", "L")).start()
    return bytes(store.get("late"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--legacy", action="store_true", help="use the non-libuv server")
    args = parser.parse_args()
    here, there = multiprocessing.get_context("fork").Pipe()
    proxy = multiprocessing.get_context("fork").Process(
        target=_proxy_process, args=(there,), daemon=True
    )
    proxy.start()  # before torch is imported: a fork after it would copy its threads' locks
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=not args.legacy)
    here.send(master.port)
    port = here.recv()
    timeout = datetime.timedelta(seconds=10)
    calls: list[tuple[str, Callable[[], Any]]] = []
    handles: dict[str, Any] = {}
    calls.append(("connect", lambda: handles.setdefault("store", _client(dist, port, timeout))))
    calls.append(("connect-other", lambda: handles.setdefault("o", _client(dist, port, timeout))))
    for name, call in calls + _calls(_Lazy(handles, "store"), _Lazy(handles, "o")):
        if args.legacy and name.startswith("queue"):
            continue  # the legacy server has no queues: it drops the connection on QUEUE_*
        here.send(name)
        _print(here.recv())
        try:
            result: Any = call()
        except Exception as exc:  # noqa: BLE001 - the error is what we record
            result = f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
        print(f"== {name}: {result!r}", flush=True)
    here.send("end")
    _print(here.recv())


def _client(dist: Any, port: int, timeout: datetime.timedelta) -> Any:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)


def _print(log: list[tuple[str, str, bytes]]) -> None:
    for label, direction, data in log:
        print(f"   [{label}] {direction} {data.hex(' ')}  {data!r}", flush=True)


class _Lazy:
    """Resolves a client created by an earlier call, when a later call runs."""

    def __init__(self, handles: dict[str, Any], name: str) -> None:
        self._handles = handles
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._handles[self._name], attr)


if __name__ == "__main__":
    main()
