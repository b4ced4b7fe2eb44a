"""A tracker config checked at submit, where a mistake can be known before the job runs.

Each failure is a UsageError (exit 2) naming where the value was given (``FILE [SECTION] KEY``
or the variable) and what is expected. What only the job can know (a ``MODULE:FACTORY`` that
exists in the job's image alone) is left to the job, as TorchX does.
"""

from __future__ import annotations

import os

from xrun.errors import UsageError
from xrun.tracker.resolve import BUILTINS, ENTRY_POINT_GROUP, Tracker, entry_point

MLFLOW_CONNECT_TIMEOUT_S = 3.0


def check_trackers(trackers: list[Tracker]) -> None:
    for t in trackers:
        _check_name(t)
        if t.name == "fsspec" and t.config:
            _check_fsspec(t)
        elif t.name == "mlflow":
            _check_mlflow(t)


def _check_name(t: Tracker) -> None:
    if t.name in BUILTINS or "." in t.name or ":" in t.name:
        return
    if entry_point(t.name) is not None:
        return
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import difflib

    close = difflib.get_close_matches(t.name, list(BUILTINS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(
        f"{t.name_source}: unknown tracker backend {t.name!r}{hint}; expected "
        f"{', '.join(BUILTINS)}, an entry point of the group {ENTRY_POINT_GROUP!r} or "
        "MODULE:FACTORY"
    )


def _check_fsspec(t: Tracker) -> None:
    config = str(t.config)
    if os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(
                f"{t.config_source}={config}: cannot read the tracker config file "
                f"({e.strerror if isinstance(e, OSError) else e}); give a readable file with "
                "protocol=... and root_path=... lines, or a directory/URL"
            ) from None
        keys = {line.partition("=")[0].strip() for line in text.splitlines() if "=" in line}
        if not {"protocol", "root_path"} <= keys:
            raise UsageError(
                f"{t.config_source}={config}: the tracker config file gives no protocol=... "
                "and root_path=... lines; add them, or give a directory/URL as the config"
            )
        return
    if "://" in config and not config.startswith("file://"):
        _check_protocol(t, config)  # the rest only the job's credentials and network can tell
        return
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.xdg import check_writable_dir

    path = config.removeprefix("file://")
    try:
        check_writable_dir(path, f"the fsspec tracker's root, {t.config_source}")
    except UsageError as e:
        raise UsageError(f"{t.config_source}={config}: {e}") from None
    if not os.path.lexists(path):
        _check_creatable(t, config, path)


def _check_creatable(t: Tracker, config: str, path: str) -> None:
    """A missing root under a dir that takes no new dirs (``/proc``, whose permission bits say
    writable): an empty dir made and removed at once in its nearest existing ancestor."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import tempfile

    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".xrun-check-", dir=probe))
    except OSError as e:
        raise UsageError(
            f"{t.config_source}={config}: the fsspec tracker's root cannot be created under "
            f"{probe} ({e.strerror}); give a writable directory"
        ) from None


def _check_protocol(t: Tracker, config: str) -> None:
    """An fsspec URL whose protocol fsspec does not know, or whose implementation is not
    installed (``s3://`` without s3fs)."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import fsspec

    protocol = config.partition("://")[0]
    if protocol not in fsspec.available_protocols():
        raise UsageError(
            f"{t.config_source}={config}: fsspec knows no protocol {protocol!r}; give a "
            "directory, file://DIR or a URL of an fsspec filesystem (memory://, s3://...)"
        )
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise UsageError(f"{t.config_source}={config}: {e}") from None


def _check_mlflow(t: Tracker) -> None:
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.mlflow_backend import parse_config

    uri, _ = parse_config(t.config)
    if uri and uri.startswith(("http://", "https://")):
        _check_reachable(uri, t)


def _check_reachable(uri: str, t: Tracker) -> None:
    """An HTTP answer from the server (any status: a 401 is an answer), within
    MLFLOW_CONNECT_TIMEOUT_S: a refused connection, and a server that accepts it and never
    answers, are both refused at submit. The name lookup has no timeout of its own, so it all
    runs in a thread that is not waited for longer."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import threading

    from xrun.tracker.guard import mask

    errors: list[str] = []

    def probe() -> None:
        try:
            _http_answer(uri)
        except _Silent:
            errors.append(
                f"accepts connections but gave no answer within {MLFLOW_CONNECT_TIMEOUT_S:g} s"
            )
        except (OSError, ValueError) as e:
            errors.append(f"is unreachable ({e})")

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(MLFLOW_CONNECT_TIMEOUT_S * 2 + 0.5)
    if worker.is_alive():
        errors.append(f"is unreachable (no answer in {MLFLOW_CONNECT_TIMEOUT_S * 2:g} s)")
    if errors:
        raise UsageError(
            f"{t.config_source}={mask(str(t.config))}: the MLflow server at {mask(uri)} "
            f"{errors[0]}; start it (mlflow server --host 127.0.0.1 --port 5000) or fix the URI"
        )


def _http_answer(uri: str) -> None:
    """One ``GET <path>/health`` and its status line; no credentials are sent."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import http.client
    import ssl
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    host, timeout = parts.hostname or "", MLFLOW_CONNECT_TIMEOUT_S
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        # only whether it answers: the job's own TLS settings decide the rest
        context = ssl._create_unverified_context()
        conn = http.client.HTTPSConnection(
            host, parts.port or 443, timeout=timeout, context=context
        )
    else:
        conn = http.client.HTTPConnection(host, parts.port or 80, timeout=timeout)
    try:
        conn.connect()  # OSError: unreachable
        try:
            conn.request("GET", parts.path.rstrip("/") + "/health")
            conn.getresponse().close()
        except TimeoutError:
            raise _Silent from None
        except http.client.HTTPException:
            pass  # it answered, whatever it said
    finally:
        conn.close()


class _Silent(Exception):
    """Connected, and no answer within the timeout."""
