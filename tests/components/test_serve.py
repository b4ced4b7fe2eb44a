"""``serve.torchserve`` (TorchX's builtin, gap row 8/35): its AppDef as TorchX's, and a real
run on local_cwd against an HTTP management API that behaves as TorchServe's register call
does (it downloads the archive from the URL it is given). TorchServe itself (a Java server) is
not installed here: the protocol is exercised end to end, TorchServe's model loading is not."""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import xrun
from xrun.components.serve import torchserve

ARCHIVE = b"a model archive \x00\x01" * 1000


def test_appdef_is_torchx_s() -> None:
    app = torchserve("s3://b/m.mar", "http://ts:8081", params={"model_name": "m"}, dryrun=True)
    [role] = app.roles
    assert (app.name, role.name, role.port_map) == (
        "torchx-torchserve",
        "worker",
        {"model-download": 8222},
    )
    assert role.args[2:] == [
        "--model_path",
        "s3://b/m.mar",
        "--management_api",
        "http://ts:8081",
        "--model_name",
        "m",
        "--dryrun",
    ]
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (1, 0, 1024)


class _ManagementApi(BaseHTTPRequestHandler):
    """TorchServe's ``POST /models?url=...``: fetch the archive, answer 200 (or 409 when the
    model name is taken)."""

    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        parsed = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        if parsed.path != "/models" or "url" not in query:
            self.send_response(400)
            self.end_headers()
            return
        with urllib.request.urlopen(query["url"], timeout=30) as r:  # noqa: S310
            body = r.read()
        _ManagementApi.seen.append({**query, "bytes": body})
        taken = query.get("model_name") == "taken"
        self.send_response(409 if taken else 200)
        self.end_headers()
        answer = {"status": f'Model "{query.get("model_name", "model")}" Version: 1.0 registered'}
        if taken:
            answer = {"code": 409, "message": "Model version 1.0 is already registered."}
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def management_api() -> Any:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ManagementApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _ManagementApi.seen.clear()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.timeout(120)
def test_registers_the_archive_and_fails_when_refused(tmp_path: Path, management_api: str) -> None:
    (tmp_path / "m.mar").write_bytes(ARCHIVE)
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}

    def run(name: str) -> Any:
        return xrun(
            "run", "--wait", "--log", "-s", "local_cwd", "serve.torchserve",
            "--model_path", str(tmp_path / "m.mar"), "--management_api", management_api,
            "--params", f"model_name={name},initial_workers=1,port=0",
            cwd=tmp_path, env=env, timeout=100,
        )  # fmt: skip

    ok = run("resnet")
    assert ok.returncode == 0, ok.stderr[-3000:]
    [seen] = _ManagementApi.seen
    assert seen["bytes"] == ARCHIVE
    assert (seen["model_name"], seen["initial_workers"]) == ("resnet", "1")
    assert seen["url"].startswith("http://127.0.0.1:") and seen["url"].endswith(".mar")
    assert "registered" in ok.stdout + ok.stderr
    refused = run("taken")
    assert refused.returncode != 0
    assert "TorchServe refused the model: HTTP 409" in refused.stdout + refused.stderr
