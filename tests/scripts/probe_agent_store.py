"""Worker script: find the rendezvous store its agent (the parent process) listens on and try
it without a token. Writes OUT_DIR/probe.json: {"listen": [[addr, port], ...], "refused": bool,
"env": {name: value or null}} for the secret's env vars. Linux only (reads /proc).

Usage: probe_agent_store.py OUT_DIR
"""

import json
import os
import socket
import struct
import sys

from xrun.runtime.store import StoreAuthError, StoreClient


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = f[1].split(":")
            raw = bytes.fromhex(addr_hex)
            # the kernel prints each 32-bit word in host (little-endian) order
            words = struct.unpack(f"<{len(raw) // 4}I", raw)
            addr = socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words))
            out.append((addr, int(port_hex, 16)))
    return out


def main() -> None:
    listen = listening(os.getppid())
    refused = []
    for addr, port in listen:
        try:
            StoreClient(addr, port, None, connect_timeout=5, read_timeout=5).close()
            refused.append(False)
        except StoreAuthError:
            refused.append(True)
    env = {k: os.environ.get(k) for k in ("XRUN_RDZV_TOKEN", "XRUN_RDZV_TOKEN_FILE")}
    with open(os.path.join(sys.argv[1], "probe.json"), "w") as f:
        json.dump({"listen": listen, "refused": refused, "env": env}, f)


if __name__ == "__main__":
    main()
