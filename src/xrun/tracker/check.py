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
        return  # a remote store: only the job's own credentials and network can tell
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.xdg import check_writable_dir

    path = config.removeprefix("file://")
    try:
        check_writable_dir(path, f"the fsspec tracker's root, {t.config_source}")
    except UsageError as e:
        raise UsageError(f"{t.config_source}={config}: {e}") from None


def _check_mlflow(t: Tracker) -> None:
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker.mlflow_backend import parse_config

    uri, _ = parse_config(t.config)
    if uri and uri.startswith(("http://", "https://")):
        _check_reachable(uri, t)


def _check_reachable(uri: str, t: Tracker) -> None:
    """A TCP connection to the server, within MLFLOW_CONNECT_TIMEOUT_S: the name lookup too,
    which has no timeout of its own, so it runs in a thread that is not waited for longer."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import socket
    import threading
    from urllib.parse import urlsplit

    errors: list[BaseException] = []

    def connect() -> None:
        try:
            parts = urlsplit(uri)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            with socket.create_connection(
                (parts.hostname or "", port), timeout=MLFLOW_CONNECT_TIMEOUT_S
            ):
                pass
        except (OSError, ValueError) as e:
            errors.append(e)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(MLFLOW_CONNECT_TIMEOUT_S + 0.5)
    if worker.is_alive():
        errors.append(TimeoutError(f"no answer in {MLFLOW_CONNECT_TIMEOUT_S:g} s"))
    if errors:
        raise UsageError(
            f"{t.config_source}={t.config}: the MLflow server at {uri} is unreachable "
            f"({errors[0]}); start it (mlflow server --host 127.0.0.1 --port 5000) or fix the URI"
        )
