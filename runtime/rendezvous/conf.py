"""``--rdzv-conf``: its keys, their one parser (the command line uses it too) and the job's secret.

``parse_rdzv_conf`` checks every value xrun uses up front, so a value the rendezvous would
reject later (``is_host=maybe``, ``token_file=``, heartbeat_interval >= timeout) fails as a
one-line usage error before the agent binds or waits for anything. Every key torchrun's
backends read is accepted: ``keep_alive_interval``/``keep_alive_max_attempt`` set the
heartbeat (a node is dropped after interval x attempts), the rest (``store_type``,
``use_libuv``, etcd's TLS keys...) mean nothing to xrun's store. A key no backend knows is
ignored with a one-line warning, as torchrun ignores it (silently).
"""

from __future__ import annotations

import os
import select
import stat
import sys
from collections.abc import Mapping
from typing import Any

from xrun.contract import MAX_DURATION_S, TOKEN_ENV, TOKEN_FILE_ENV
from xrun.errors import UsageError
from xrun.limits import to_float
from xrun.record import Value

# The most a token file may hold: a secret is tens of bytes (xrun writes 32 hex digits). Read
# with this cap, so that a token file that is /dev/zero or a huge file is one line, not the
# agent reading until it runs out of memory.
MAX_TOKEN_BYTES = 4096

__all__ = ["CONF_KEYS", "RdzvConfig", "config_from_conf", "load_token", "parse_rdzv_conf"]


DEFAULT_HEARTBEAT_INTERVAL = 5.0
# The timeouts, in seconds: RdzvConfig's first fields and the --rdzv-conf keys that take them.
_SECONDS_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "exit_barrier_timeout",
    "heartbeat_interval",
    "heartbeat_timeout",
    "read_timeout",
)


class RdzvConfig(Value):
    """The typed form of ``--rdzv-conf`` (seconds for every timeout). A :class:`xrun.record.Value`: a
    dataclass costs every agent's start-up (benchmark 1) ~1 ms to make.

    - ``join_timeout``: how long next_rendezvous waits for a world to form (also: for the
      store to come up).
    - ``last_call_timeout``: with MIN..MAX nodes, how long after the latest arrival a round
      with >= MIN nodes waits for more before it forms.
    - ``close_timeout``: how long the store's host keeps serving after close() so that peers
      read the verdict.
    - ``exit_barrier_timeout``: torchrun's exit barrier: how long the store's host, its own
      workers done, waits for the other nodes' workers to finish before it closes the job (as
      failed, naming the laggards) and stops serving. Long on purpose: nodes of one job may
      finish minutes apart (a slower GPU, a last checkpoint), and a shorter bound fails a job
      whose every worker succeeded.
    - ``heartbeat_interval``/``heartbeat_timeout``: a node renews its lease every interval; one
      silent for the timeout is dropped (a node whose agent died is dropped at once: its
      connection closes).
    - ``read_timeout``: how long a store request may take beyond its own server-side wait.
    - ``token_file``: a file holding the job's secret (see load_token).
    - ``is_host``: torchrun's key: force (true) or forbid (false) serving the store on this node.
    """

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    heartbeat_timeout: float = 15.0
    read_timeout: float = 60.0
    token_file: str | None = None
    is_host: bool | None = None


_DEFAULTS = RdzvConfig()  # the example value in a refused timeout's message

CONF_KEYS = (*_SECONDS_KEYS, "timeout", "token_file", "is_host")
# torchrun's heartbeat keys (c10d): a node is dropped after interval x max_attempt seconds.
_KEEP_ALIVE_KEYS = ("keep_alive_interval", "keep_alive_max_attempt")
# Keys torchrun's backends read that have no meaning for xrun's store (c10d's store flavour,
# etcd's endpoint options).
TORCH_ONLY_KEYS = (
    "store_type",
    "use_libuv",
    "protocol",
    "cacert",
    "cert",
    "key",
    "ssl_cert",
    "ssl_cert_key",
    "ca_cert",
    "etcd_prefix",
)
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def parse_rdzv_conf(s: str, strict: bool = False) -> dict[str, str]:
    """Split and validate ``--rdzv-conf`` (``"join_timeout=60,last_call_timeout=5"``).

    Returns the raw ``key -> value`` strings (what ``RendezvousParams.conf`` holds) after checking
    every key and value, so the agent can reject a typo before it starts anything. ``strict``
    (the components, at submit time) refuses a key no backend knows instead of warning.
    """
    out: dict[str, str] = {}
    text = s.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # shell quotes passed through literally (as in PyTorch's own tests)
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if sep and not key:  # '==' or '=600': a value for no key is a typo, not a key ''
            raise UsageError(
                f"--rdzv-conf item {item!r} has no key; expected KEY=VALUE, e.g. "
                f"'join_timeout=600,last_call_timeout=30'"
            )
        if not sep:
            raise UsageError(
                f"--rdzv-conf item {item!r} is not KEY=VALUE; expected e.g. "
                f"'join_timeout=600,last_call_timeout=30'"
            )
        out[key] = value.strip()
    config_from_conf(out, strict)
    return out


def config_from_conf(conf: Mapping[str, str], strict: bool = False) -> RdzvConfig:
    """Typed, validated config; raises UsageError naming the bad key, its form and the fix."""
    values: dict[str, Any] = {}
    for key, raw in conf.items():
        if key == "token":
            raise UsageError(
                "--rdzv-conf token=... would put the job's secret on the command line; set "
                f"${TOKEN_ENV}, ${TOKEN_FILE_ENV} or --rdzv-conf token_file=PATH instead"
            )
        if key in _KEEP_ALIVE_KEYS:
            values[key] = _positive(key, raw)
            continue
        if key in TORCH_ONLY_KEYS:
            continue
        if key not in CONF_KEYS:
            if strict:
                raise UsageError(
                    f"--rdzv-conf key {key!r} is not known to any rendezvous backend; "
                    f"xrun's keys: {', '.join((*CONF_KEYS, *_KEEP_ALIVE_KEYS))}"
                )
            _warn_unknown(key)
            continue
        if key in _SECONDS_KEYS or key == "timeout":
            v = _seconds(key, raw)
            # torchrun's static rendezvous calls its join timeout plain "timeout".
            values["join_timeout" if key == "timeout" else key] = v
        elif key == "is_host":
            if raw.lower() not in _BOOLS:
                raise UsageError(
                    f"--rdzv-conf is_host={raw!r} is not a boolean; write is_host=true or is_host=false"
                )
            values[key] = _BOOLS[raw.lower()]
        else:  # token_file
            if not raw:
                raise UsageError(
                    "--rdzv-conf token_file= is empty; give the path of a file holding the job's secret"
                )
            values[key] = raw
    interval = values.pop("keep_alive_interval", None)
    attempts = values.pop("keep_alive_max_attempt", None)
    if interval is not None or attempts is not None:
        values.setdefault("heartbeat_interval", interval or DEFAULT_HEARTBEAT_INTERVAL)
        values.setdefault("heartbeat_timeout", values["heartbeat_interval"] * (attempts or 3))
    cfg = RdzvConfig(**values)
    if cfg.heartbeat_timeout > MAX_DURATION_S:
        raise UsageError(
            f"--rdzv-conf keep_alive_interval x keep_alive_max_attempt = "
            f"{cfg.heartbeat_timeout:g}s is over a day ({MAX_DURATION_S:g}s); give smaller values"
        )
    if cfg.heartbeat_interval >= cfg.heartbeat_timeout:
        raise UsageError(
            f"--rdzv-conf heartbeat_interval={cfg.heartbeat_interval:g} must be smaller than "
            f"heartbeat_timeout={cfg.heartbeat_timeout:g} (a node would be dropped between two "
            f"heartbeats); e.g. heartbeat_interval=5,heartbeat_timeout=15"
        )
    return cfg


_WARNED: set[str] = set()


def _warn_unknown(key: str) -> None:
    """One line per unknown key and process: torchrun's backends ignore such a key silently,
    which hides a typo; xrun says so and carries on."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    known = ", ".join((*CONF_KEYS, *_KEEP_ALIVE_KEYS))
    print(
        f"xrun-agent: warning: --rdzv-conf key {key!r} is not known to any rendezvous "
        f"backend and is ignored (xrun's keys: {known})",
        file=sys.stderr,
    )


def _seconds(key: str, raw: str) -> float:
    """A timeout: more than 0, at most a day (NaN and infinities refused)."""
    example = int(getattr(_DEFAULTS, key, 600))
    return _in_range(
        key, raw, f"a number of seconds above 0 and up to {MAX_DURATION_S:g} (a day)", example
    )


def _positive(key: str, raw: str) -> float:
    # keep_alive_interval is seconds, keep_alive_max_attempt a count: a day bounds both
    return _in_range(key, raw, f"a positive number up to {MAX_DURATION_S:g}", 5)


def _in_range(key: str, raw: str, form: str, example: int) -> float:
    """``raw`` as a float in (0, MAX_DURATION_S], else one line naming ``form``."""
    v = to_float(raw)  # NaN for '٢' (ASCII digits only, as everywhere) and for no number
    if not 0 < v <= MAX_DURATION_S:
        raise UsageError(
            f"--rdzv-conf {key}={raw[:40]!r} is not {form}; write e.g. {key}={example}"
        )
    return v


# How long a token file that is a pipe may take to say something (a FIFO nobody writes would
# otherwise block the agent for ever; `<(echo secret)` answers at once).
_PIPE_WAIT_S = 10.0


def _read_capped(path: str) -> bytes:
    """At most MAX_TOKEN_BYTES + 1 bytes of ``path``, in bounded time: opened without blocking
    (a FIFO with no writer), a pipe waited for at most _PIPE_WAIT_S."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    chunks: list[bytes] = []
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode):
            if not select.select([fd], [], [], _PIPE_WAIT_S)[0]:
                raise OSError(
                    0, f"nothing to read within {_PIPE_WAIT_S:g}s (a pipe with no writer?)"
                )
        else:
            os.set_blocking(fd, True)
        size = 0
        while size <= MAX_TOKEN_BYTES:
            chunk = os.read(fd, MAX_TOKEN_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except BlockingIOError:  # a pipe whose writer has not finished: what came so far
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_token(cfg: RdzvConfig, env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's secret: conf ``token_file``, else file ``$XRUN_RDZV_TOKEN_FILE``, else
    ``$XRUN_RDZV_TOKEN``; None when none is configured. Never read from a command line."""
    env = os.environ if env is None else env
    path = cfg.token_file or env.get(TOKEN_FILE_ENV)
    if path:
        try:
            raw = _read_capped(path)
        except OSError as e:
            raise UsageError(
                f"cannot read the rendezvous token file {path!r}: {e.strerror}; "
                f"point token_file / ${TOKEN_FILE_ENV} at a readable file"
            ) from None
        if len(raw) > MAX_TOKEN_BYTES:
            raise UsageError(
                f"the rendezvous token file {path!r} holds over {MAX_TOKEN_BYTES:,} bytes; a "
                "token is a short secret (e.g. 32 hex digits): point the file at it"
            )
        token = raw.strip()
        if not token:
            raise UsageError(
                f"the rendezvous token file {path!r} is empty; write the job's secret in it"
            )
        return token
    token_s = env.get(TOKEN_ENV)
    return token_s.encode() if token_s else None
