"""The replica side of ``serve.torchserve`` (``python3 -m xrun.components._serve``; the CLI
never imports it): copy the archive, serve it over HTTP, register it with TorchServe.

    --model_path URL --management_api URL [--timeout S] [--port P] [--dryrun]
    [--model_name ...] [--handler ...] ... (TorchServe's register-a-model parameters)

Standard library only (urllib, http.server), fsspec for a model path that is a URL.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from .serve import DOWNLOAD_PORT, TORCHSERVE_PARAMS


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="serve.torchserve", description="register a model")
    p.add_argument("--model_path", required=True)
    p.add_argument("--management_api", required=True)
    p.add_argument("--timeout", type=int, default=60, help="seconds for TorchServe's answer")
    p.add_argument("--port", type=int, default=DOWNLOAD_PORT, help="the archive's HTTP port")
    p.add_argument("--dryrun", action="store_true", help=argparse.SUPPRESS)
    for name in TORCHSERVE_PARAMS:
        p.add_argument(f"--{name}")
    return p.parse_args(argv)


def _copy(src: str, dst: str) -> None:
    if "://" not in src:
        shutil.copyfile(src, dst)
        return
    import fsspec  # only for a URL: a python3-only image registers local archives

    fs, path = fsspec.core.url_to_fs(src)
    fs.get(path, dst)


def _address_towards(url: str) -> str:
    """This host's address on the route to ``url``'s host (what TorchServe can reach)."""
    parsed = urllib.parse.urlparse(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((parsed.hostname or "localhost", parsed.port or 80))  # no packet is sent
        return str(s.getsockname()[0])


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.dryrun:
        print("App serve started successfully")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        name = f"{args.model_name or 'model'}_{secrets.token_hex(8)}.mar"
        print(f"downloading model from {args.model_path} to {os.path.join(tmp, name)}...")
        _copy(args.model_path, os.path.join(tmp, name))
        handler = partial(SimpleHTTPRequestHandler, directory=tmp)
        server = ThreadingHTTPServer(("", args.port), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://{_address_towards(args.management_api)}:{server.server_port}/{name}"
            print(f"serving file at {url}")
            query = {"url": url}
            query.update({k: getattr(args, k) for k in TORCHSERVE_PARAMS if getattr(args, k)})
            target = f"{args.management_api.rstrip('/')}/models?{urllib.parse.urlencode(query)}"
            print(f"POST {target}")
            request = urllib.request.Request(target, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=args.timeout) as resp:  # noqa: S310
                    print(resp.read().decode(errors="replace"))
            except urllib.error.HTTPError as e:
                body = e.read().decode(errors="replace").strip()
                print(f"TorchServe refused the model: HTTP {e.code}: {body}", file=sys.stderr)
                return 1
            except (urllib.error.URLError, OSError) as e:
                print(f"cannot reach {args.management_api}: {e}", file=sys.stderr)
                return 1
        finally:
            print("shutting down...")
            server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
