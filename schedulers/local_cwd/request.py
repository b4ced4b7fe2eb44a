"""The local_cwd request: what ``--dryrun`` prints and ``schedule()`` executes (a value).

Built from an AppDef and the resolved run options, with no side effects: per replica the
argv (macros substituted), the environment set on top of the launcher's, and the log paths.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from xrun.config import current_dir
from xrun.contract import (
    AGENT_LOG_DIR_ENV,
    APP_DIR_ENV,
    EXIT_RECORD_ENV,
    MASTER_PORT_DEFAULT,
    NODE_ID_ENV,
    RANK0_HOST_ENV,
    RDZV_PORT_ENV,
    SCRIPT,
    STOP_GRACE_ENV,
    TOKEN_ENV,
    TORCHX_RANK0_HOST_ENV,
)
from xrun.errors import UsageError
from xrun.procs import visible_gpus
from xrun.specs import AppDef, Role, appdef_to_dict, macros
from xrun.torchx.shim_dir import role_shim
from xrun.xdg import check_writable_dir

from ..api import replicas_role_may_lose
from . import statedir
from .options import LocalOptions


@dataclass
class ReplicaRequest:
    role: str
    id: int
    argv: list[str]
    env: dict[str, str]  # set on top of the launcher's environment
    stdout: str
    stderr: str
    error_file: str


@dataclass
class LocalRequest:
    """Everything schedule() needs; its text form is what ``--dryrun`` prints."""

    app_id: str
    app_dir: str
    cwd: str
    grace_s: float
    replicas: list[ReplicaRequest]
    app: dict[str, Any] = field(default_factory=dict)  # appdef_to_dict form, for describe()
    notes: list[str] = field(default_factory=list)
    # role -> how many of its replicas may fail before the app does (elastic roles: > 0)
    tolerate: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def format_request(req: LocalRequest) -> str:
    lines = [
        f"# local_cwd app {req.app_id}: {len(req.replicas)} replica(s) in {req.cwd}",
        f"# logs and state: {req.app_dir}",
        f"# a replica failing stops the others: SIGTERM, {req.grace_s:g}s grace, SIGKILL",
    ]
    lines += [
        f"# role {role} is elastic: the app fails once more than {n} of its replicas fail"
        for role, n in req.tolerate.items()
        if n
    ]
    lines += [f"# note: {n}" for n in req.notes]
    for r in req.replicas:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(r.env.items()))
        lines.append(f"# {r.role}/{r.id}: stdout {r.stdout}, stderr {r.stderr}")
        lines.append(f"env {env} {shlex.join(r.argv)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- helpers
def make_app_id(name: str) -> str:
    """``<name as a slug>-<10 random chars>``: readable, unique, safe as a dir name."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:40] or "app"
    # os.urandom rather than `secrets`: that module pulls in hashlib/OpenSSL (~10 ms at start-up)
    n = int.from_bytes(os.urandom(8), "big")
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    token = ""
    for _ in range(10):
        n, d = divmod(n, 36)
        token += alphabet[d]
    return f"{slug}-{token}"


def _which(cmd: str, path: str, cwd: str) -> str | None:
    """Where ``cmd`` would be executed from, searching ``path`` (as execvpe does), or None."""
    if os.sep in cmd:
        full = os.path.join(cwd, cmd)
        return full if os.path.isfile(full) and os.access(full, os.X_OK) else None
    for d in path.split(os.pathsep):
        full = os.path.join(d or ".", cmd)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return full
    return None


def assign_gpus(roles: list[Role], devices: list[str]) -> dict[tuple[str, int], list[str]]:
    """Split ``devices`` across replicas by ``resource.gpu``, in role/replica order.

    No devices: nothing assigned (a CPU host runs the same app unchanged).
    """
    out: dict[tuple[str, int], list[str]] = {}
    if not devices:
        return out
    wanted = sum(max(r.resource.gpu, 0) * r.num_replicas for r in roles)
    if wanted > len(devices):
        detail = ", ".join(f"{r.name}: {r.num_replicas} x {r.resource.gpu}" for r in roles)
        raise UsageError(
            f"auto_set_cuda_visible_devices: the app asks for {wanted} GPUs ({detail}) but this "
            f"host has {len(devices)} visible ({','.join(devices)}); ask for fewer (-j, --gpu) "
            "or pass -cfg auto_set_cuda_visible_devices=False"
        )
    nxt = 0
    for role in roles:
        for i in range(role.num_replicas):
            if role.resource.gpu > 0:
                out[(role.name, i)] = devices[nxt : nxt + role.resource.gpu]
                nxt += role.resource.gpu
    return out


def _path_with(first: list[str], path: str) -> str:
    """``first`` + ``path``'s entries, each dir once (the first occurrence wins)."""
    parts = first + [p for p in path.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def build_request(app: AppDef, opts: LocalOptions) -> LocalRequest:
    """The request for ``app`` with resolved run options ``opts``: pure, no side effects."""
    cwd = current_dir()  # first: a relative log_dir or script path needs it too
    app_id = make_app_id(app.name)
    log_dir = os.path.abspath(os.path.expanduser(opts.log_dir or statedir.default_log_dir()))
    check_writable_dir(log_dir, "-cfg log_dir=DIR, default $XDG_STATE_HOME/xrun/local_cwd/logs")
    paths = statedir.AppPaths(os.path.join(log_dir, app_id))
    first = [os.path.dirname(sys.executable)] + ([cwd] if opts.prepend_cwd else [])
    path = _path_with(first, os.environ.get("PATH", os.defpath))
    gpus = assign_gpus(app.roles, visible_gpus()) if opts.auto_set_cuda_visible_devices else {}
    replicas = []
    notes = []
    found: set[tuple[str, str]] = set()  # (entrypoint, PATH) checked: once, not per replica
    for role in app.roles:
        if role.mounts:
            notes.append(f"role {role.name}: mounts are ignored (local_cwd uses the host's files)")
        shim = role_shim(role.env)
        for i in range(role.num_replicas):
            values = macros.Values(
                img_root=cwd, app_id=app_id, replica_id=str(i), rank0_env=RANK0_HOST_ENV
            )
            # Only the args and env, not values.apply's deep copy of the whole role per
            # replica (most of a 65,536-replica dry run's work).
            args, role_env = values.fill(role)
            env = {
                "PATH": path,
                "PYTHONUNBUFFERED": "1",
                RANK0_HOST_ENV: "localhost",
                TORCHX_RANK0_HOST_ENV: "localhost",
                "TORCHELASTIC_ERROR_FILE": paths.error_file(role.name, i),
                # A runtime agent's per-attempt worker logs, under the app's dir (not a
                # temporary dir nobody removes): <role>/<i>/workers/<run_id>/attempt_<n>/.
                AGENT_LOG_DIR_ENV: os.path.join(paths.replica_dir(role.name, i), "workers"),
                # A stop (cancel, SIGTERM to the supervisor) gives the workers stop_grace_s to
                # save (runtime/stopping.py), not the agent's shorter shutdown timeout.
                STOP_GRACE_ENV: f"{opts.stop_grace_s:g}",
                # Each replica is a node of its own to the runtime's quarantine, though they
                # share this host (else a lost replica would quarantine the host).
                NODE_ID_ENV: f"{role.name}/{i}",
            }
            if (role.name, i) in gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(role.name, i)])
            env.update(role_env)  # the role's own env wins, PATH included
            if shim:  # a TorchX script's `from torchx.tracker import ...` (gap N16)
                given = role_env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
                env["PYTHONPATH"] = os.pathsep.join(p for p in (given, shim) if p)
            # ... but not over what status and cancel rely on (see xrun.contract)
            env[APP_DIR_ENV] = paths.app_dir
            env[EXIT_RECORD_ENV] = paths.exit_record(role.name, i)
            if (role.entrypoint, env["PATH"]) not in found:
                check_entrypoint(role.name, role.entrypoint, env["PATH"], cwd)
                found.add((role.entrypoint, env["PATH"]))
            replicas.append(
                ReplicaRequest(
                    role=role.name,
                    id=i,
                    argv=[role.entrypoint, *args],
                    env=env,
                    stdout=paths.log_file(role.name, i, "stdout"),
                    stderr=paths.log_file(role.name, i, "stderr"),
                    error_file=paths.error_file(role.name, i),
                )
            )
    tolerate = {r.name: replicas_role_may_lose(r) for r in app.roles}
    req = LocalRequest(
        app_id,
        paths.app_dir,
        cwd,
        opts.stop_grace_s,
        replicas,
        appdef_to_dict(app),
        notes,
        tolerate,
    )
    return req


def with_rdzv_env(req: LocalRequest) -> LocalRequest:
    """A copy of ``req`` whose replicas share a fresh rendezvous secret (``XRUN_RDZV_TOKEN``)
    and, per multi-replica role, a free rendezvous port (``XRUN_RDZV_PORT``, which dist.ddp's
    default port defers to: every local replica is on this host, where two multi-node apps on
    29500 would meet).

    Made at schedule time, not in the request value, so ``--dryrun`` never shows the secret; it
    reaches the agents through their environment (and the app's 0600 state file), never a
    command line. A role's own env wins over both.
    """
    token = os.urandom(16).hex()
    out = copy.deepcopy(req)
    sizes: dict[str, int] = {}
    for r in out.replicas:
        sizes[r.role] = sizes.get(r.role, 0) + 1
    ports = {role: str(_free_port()) for role, n in sizes.items() if n > 1}
    for r in out.replicas:
        r.env.setdefault(TOKEN_ENV, token)
        if r.role in ports:
            r.env.setdefault(RDZV_PORT_ENV, ports[r.role])
    return out


def check_scripts_exist(req: LocalRequest) -> None:
    """A dist role's ``--script`` is a file in the job's cwd at submit (not at the dry run,
    which may be written anywhere): local_cwd runs the job right here, and a missing script
    would otherwise only fail as the app."""
    for role in req.app.get("roles", []):
        script = (role.get("metadata") or {}).get(SCRIPT)
        if not isinstance(script, str) or "$" in script:  # a macro: known in the replica only
            continue
        if not os.path.isfile(os.path.join(req.cwd, script)):
            raise UsageError(
                f"role {role.get('name')!r}: --script {script!r} is no file in {req.cwd} "
                "(local_cwd runs the job in the current directory); give an existing script"
            )


def check_ports_free(req: LocalRequest) -> None:
    """UsageError (exit 2) naming the port when a port the app asked for is taken on this host.

    Every local replica runs here, so a fixed ``--rdzv_port`` that another job's store holds
    would otherwise fail as an app, with an agent told by that job's store that its token is
    wrong. The components' default port is not checked: a multi-node dist job defers it to the
    free ``XRUN_RDZV_PORT`` this scheduler picks per app, a one-node one uses none.
    """
    for role in req.app.get("roles", []):
        for name, port in sorted((role.get("port_map") or {}).items()):
            if port == MASTER_PORT_DEFAULT:
                continue
            # benchmark 1: socket (~3 ms to import) only when a fixed port is to be checked;
            # a one-node job has none
            import socket

            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("", port))
                except OSError as e:
                    raise UsageError(
                        f"role {role['name']!r}: port {port} ({name}) is not free on this host "
                        f"({e.strerror}), probably another job's rendezvous; pick a free port "
                        f"(dist.ddp --rdzv_port N) or leave --rdzv_port at its default "
                        f"{MASTER_PORT_DEFAULT}, for which local_cwd picks a free port per app"
                    ) from None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_entrypoint(role: str, entrypoint: str, path: str, cwd: str) -> None:
    if not _which(entrypoint, path, cwd):
        raise UsageError(
            f"role {role!r}: entrypoint {entrypoint!r} is not an executable on PATH or "
            f"relative to {cwd}; give an existing command (e.g. python3) or a path to an "
            "executable file"
        )
