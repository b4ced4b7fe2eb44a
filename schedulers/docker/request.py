"""The docker scheduler's request value: what ``xrun run -s docker --dryrun`` prints.

:func:`materialize` turns an AppDef into a :class:`DockerJob` (one user-defined network plus one
:class:`DockerContainer` per replica) without touching the engine or importing the docker SDK,
so every naming/env/resource rule here is unit-testable. :func:`replica_state` and
:func:`app_state` are the (equally pure) status rules that ``describe`` applies to what the
engine reports.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import xrun
from xrun.contract import RANK0_HOST_ENV, STOP_GRACE_ENV, TORCHX_RANK0_HOST_ENV
from xrun.errors import UsageError
from xrun.specs import (
    AppDef,
    AppState,
    BindMount,
    DeviceMount,
    Role,
    VolumeMount,
    macros,
)
from xrun.torchx.shim_dir import SHIM, role_shim

from ..api import replicas_role_may_lose, scheduler_retries
from .options import STOP_TIMEOUT, DockerOptions

# The env var every replica gets, holding its role's replica-0 hostname; `${rank0_env}` in a
# role's args/env becomes this *name* (the dist.ddp component writes `${${rank0_env}}`, which
# the replica's own shell then expands).

# Labels on every container and network we create. `xrun.app` (the app's name) is the marker
# `list` filters on; the others let `describe` find an app from any shell, with no state of ours.
LABEL_APP = "xrun.app"
LABEL_APP_ID = "xrun.app_id"
LABEL_ROLE = "xrun.role"
LABEL_REPLICA = "xrun.replica"
LABEL_SESSION = "xrun.session"
LABEL_STOP_TIMEOUT = "xrun.stop_timeout"  # the app's stop_timeout run option, in seconds
# An elastic role's replicas carry how many of the role's replicas may fail before the app
# fails (see replicas_role_may_lose); absent: none may, the gang fails with its first failure.
LABEL_MAY_LOSE = "xrun.may_lose"

_DNS_MAX = 63

# Where a workspace image holds xrun's package tree (the default recipe, see .workspace; its
# ENV puts the folder on PYTHONPATH), and there the worker-side `torchx.tracker` stand-in.
XRUN_DIR = "/opt/xrun"
SHIM_IN_IMAGE = f"{XRUN_DIR}/xrun/" + os.path.relpath(SHIM, os.path.dirname(xrun.__file__))


@dataclass
class DockerContainer:
    """One replica: the arguments of one ``containers.run`` call, as plain data."""

    name: str  # also the hostname and the network alias
    image: str
    command: list[str]  # argv: entrypoint + args (the image's ENTRYPOINT is overridden)
    role: str
    replica_id: int
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)  # published on random host ports
    mounts: list[BindMount | VolumeMount] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # "HOST:CONTAINER:PERMS"
    nano_cpus: int | None = None
    mem_limit: str | None = None
    shm_size: str | None = None
    gpus: int = 0  # a device request for this many GPUs (-1: all)
    privileged: bool = False
    max_retries: int = 0  # restart policy on-failure with this many retries (0: none)
    stop_timeout: int = STOP_TIMEOUT  # seconds from SIGTERM to SIGKILL when the engine stops it
    # py-spy reads the workers through ptrace (`xrun stacks`, the stall watchdog), which a
    # container's default capabilities do not allow.
    cap_add: list[str] = field(default_factory=lambda: ["SYS_PTRACE"])
    # Folders appended to the image's own PYTHONPATH when the container is created (the engine
    # reads it from the image then): a container's PYTHONPATH replaces the image's, which holds
    # /opt/xrun and whatever the base image put there. Empty when ``env`` has a PYTHONPATH
    # (the role's own, which then ends with them).
    pythonpath_tail: list[str] = field(default_factory=list)

    def restart_policy(self) -> dict[str, Any] | None:
        if self.max_retries <= 0:
            return None
        return {"Name": "on-failure", "MaximumRetryCount": self.max_retries}


@dataclass
class DockerJob:
    """The whole request: a network and the containers attached to it."""

    app_id: str
    app_name: str
    network: str
    containers: list[DockerContainer]
    session: str = "default"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return format_job(self)


def format_job(job: DockerJob) -> str:
    """The readable form --dryrun prints: one block per container, the equivalent of `docker run`."""
    lines = [
        f"docker network create --label {LABEL_APP_ID}={job.app_id} {job.network}",
    ]
    for c in job.containers:
        lines.append(f"# {c.role}/{c.replica_id}")
        if c.pythonpath_tail:
            lines.append(f"# PYTHONPATH: the image's, then {':'.join(c.pythonpath_tail)}")
        opts = [
            "docker run --detach --init",
            f"--name {c.name}",
            f"--hostname {c.name}",
            f"--network {job.network} --network-alias {c.name}",
        ]
        opts += [f"--label {k}={_q(v)}" for k, v in sorted(c.labels.items())]
        opts += [f"--env {k}={_q(v)}" for k, v in sorted(c.env.items())]
        opts += [f"--publish {p}" for p in c.ports]
        for m in c.mounts:
            kind = "bind" if isinstance(m, BindMount) else "volume"
            src = m.src_path if isinstance(m, BindMount) else m.src
            ro = ",readonly" if m.read_only else ""
            opts.append(f"--mount type={kind},src={src},dst={m.dst_path}{ro}")
        opts += [f"--device {d}" for d in c.devices]
        if c.nano_cpus:
            opts.append(f"--cpus {c.nano_cpus / 1e9:g}")
        if c.mem_limit:
            opts.append(f"--memory {c.mem_limit}")
        if c.shm_size:
            opts.append(f"--shm-size {c.shm_size}")
        if c.gpus:
            opts.append(f"--gpus {'all' if c.gpus < 0 else c.gpus}")
        opts += [f"--cap-add {cap}" for cap in c.cap_add]
        if c.privileged:
            opts.append("--privileged")
        if c.max_retries:
            opts.append(f"--restart on-failure:{c.max_retries}")
        opts.append(f"--stop-timeout {c.stop_timeout}")
        opts.append(f"--entrypoint {_q(c.command[0])}")
        opts.append(_q(c.image) + "".join(" " + _q(a) for a in c.command[1:]))
        lines.append(" \\\n    ".join(opts))
    return "\n".join(lines)


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


# --------------------------------------------------------------------------- naming
def dns_label(text: str) -> str:
    """``text`` lowercased with every run of characters outside [a-z0-9-] made one '-'."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return out or "x"


def container_name(app_id: str, role: str, replica_id: int) -> str:
    """``<app_id>-<role>-<i>``, a valid DNS label (it is also the hostname and network alias).

    Too long a name keeps its start and gets a hash of the whole name, so two long roles of one
    app still get different names; the replica index always stays at the end.
    """
    base = f"{dns_label(app_id)}-{dns_label(role)}"
    suffix = f"-{replica_id}"
    if len(base) + len(suffix) > _DNS_MAX:
        digest = hashlib.sha1(base.encode()).hexdigest()[:8]
        base = base[: _DNS_MAX - len(suffix) - len(digest) - 1].rstrip("-") + "-" + digest
    return base + suffix


def make_app_id(app_name: str, unique: str) -> str:
    """``<app name>-<unique>`` as a DNS label short enough to leave room for role names."""
    return f"{dns_label(app_name)[:30].rstrip('-')}-{unique}"


# --------------------------------------------------------------------------- materialize
def _copied_env(patterns: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def materialize(
    app: AppDef,
    app_id: str,
    opts: DockerOptions,
    environ: Mapping[str, str] | None = None,
    session: str = "default",
    xrun_in_image: bool = False,
) -> DockerJob:
    """Build the request for ``app``. ``environ`` is the submitter's env (for ``copy_env``);
    ``xrun_in_image``: the images are workspace images, with xrun at :data:`XRUN_DIR`."""
    copy_env = _copied_env(opts.copy_env, environ or {})
    containers: list[DockerContainer] = []
    for role in app.roles:
        rank0_host = container_name(app_id, role.name, 0)
        # A TorchX script's `from torchx.tracker import ...` in a role the agent does not start
        # (utils.python; gap N16), as on local_cwd and slurm: the image's copy of the stand-in.
        shim = SHIM_IN_IMAGE if xrun_in_image and role_shim(role.env) else None
        for i in range(role.num_replicas):
            values = macros.Values(
                img_root="", app_id=app_id, replica_id=str(i), rank0_env=RANK0_HOST_ENV
            )
            containers.append(
                _container(app, app_id, values.apply(role), i, rank0_host, opts, session)
            )
            c = containers[-1]
            # Precedence: copied submitter env < run option env < the role's own env < ours.
            # A stop (cancel, `docker stop`) gives the workers stop_timeout to save
            # (runtime/stopping.py), not the agent's shutdown timeout; the role may say less.
            grace = {STOP_GRACE_ENV: str(opts.stop_timeout)}
            c.env = {**grace, **copy_env, **opts.env, **c.env, RANK0_HOST_ENV: rank0_host}
            c.env[TORCHX_RANK0_HOST_ENV] = rank0_host
            if shim and "PYTHONPATH" in c.env:  # after the user's entries, as the agent does
                c.env["PYTHONPATH"] = ":".join(p for p in (c.env["PYTHONPATH"], shim) if p)
            elif shim:
                c.pythonpath_tail = [shim]
    names = [c.name for c in containers]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UsageError(
            f"app {app.name!r}: two replicas would share the container name {dup!r} (role names "
            f"differ only in case or in characters outside a-z0-9-); rename one of the roles"
        )
    return DockerJob(
        app_id=app_id, app_name=app.name, network=app_id, containers=containers, session=session
    )


def _container(
    app: AppDef,
    app_id: str,
    role: Role,
    replica_id: int,
    rank0_host: str,
    opts: DockerOptions,
    session: str,
) -> DockerContainer:
    res = role.resource
    mounts: list[BindMount | VolumeMount] = []
    devices: list[str] = []
    for m in role.mounts:
        if isinstance(m, DeviceMount):
            devices.append(f"{m.src_path}:{m.dst_path}:{m.permissions}")
        else:
            mounts.append(m)
    may_lose = replicas_role_may_lose(role)
    return DockerContainer(
        name=container_name(app_id, role.name, replica_id),
        image=role.image,
        command=[role.entrypoint, *role.args],
        role=role.name,
        replica_id=replica_id,
        env=dict(role.env),
        labels={
            LABEL_APP: app.name,
            LABEL_APP_ID: app_id,
            LABEL_ROLE: role.name,
            LABEL_REPLICA: str(replica_id),
            LABEL_SESSION: session,
            **({LABEL_MAY_LOSE: str(may_lose)} if may_lose else {}),
        },
        ports=sorted(set(role.port_map.values())),
        mounts=mounts,
        devices=devices,
        nano_cpus=int(res.cpu * 1e9) if res.cpu > 0 else None,
        mem_limit=f"{res.memMB}m" if res.memMB > 0 else None,
        shm_size=opts.shm_size or None,
        gpus=res.gpu if res.gpu > 0 else 0,
        privileged=opts.privileged,
        # The engine restarts a failed container only for a role whose agents do not restart
        # its workers in place (dist.ddp's do): one owner of the retries, max_retries+1 runs.
        max_retries=scheduler_retries(role),
        stop_timeout=opts.stop_timeout,
    )


# --------------------------------------------------------------------------- status rules
def replica_state(attrs: Mapping[str, Any]) -> tuple[AppState, int | None]:
    """A container's state and exit code from its ``docker inspect`` attrs.

    An exited container whose on-failure restart policy still has retries left counts as
    RUNNING: the engine is about to restart it, and calling that FAILED would stop the gang.
    """
    st = attrs.get("State") or {}
    status = st.get("Status", "")
    code = st.get("ExitCode")
    if status == "created":
        return AppState.PENDING, None
    if status in ("running", "restarting", "paused"):
        return AppState.RUNNING, None
    if status in ("exited", "dead", "removing"):
        if code == 0:
            return AppState.SUCCEEDED, 0
        policy = (attrs.get("HostConfig") or {}).get("RestartPolicy") or {}
        if (
            policy.get("Name") == "on-failure"
            and int(attrs.get("RestartCount") or 0) < int(policy.get("MaximumRetryCount") or 0)
            and status == "exited"
        ):
            return AppState.RUNNING, code
        return AppState.FAILED, code
    return AppState.UNKNOWN, code


def app_state(
    replicas: list[tuple[str, AppState]],
    cancelled: bool,
    may_lose: Mapping[str, int] | None = None,
) -> AppState:
    """Gang semantics over ``(role, state)`` pairs: a failed replica fails the app, unless its
    (elastic) role may lose that many (``may_lose``, by role); the app succeeds when every
    replica succeeded or failed within its role's allowance."""
    if cancelled:
        return AppState.CANCELLED
    if not replicas:
        return AppState.UNKNOWN
    failed: dict[str, int] = {}
    for role, s in replicas:
        if s == AppState.FAILED:
            failed[role] = failed.get(role, 0) + 1
    if any(n > (may_lose or {}).get(role, 0) for role, n in failed.items()):
        return AppState.FAILED
    states = [s for _, s in replicas if s != AppState.FAILED]  # the failures we may ignore
    if all(s == AppState.SUCCEEDED for s in states):
        return AppState.SUCCEEDED
    if AppState.RUNNING in states or AppState.SUCCEEDED in states:
        return AppState.RUNNING
    if AppState.PENDING in states:
        return AppState.PENDING
    return AppState.UNKNOWN


def job_to_json(job: DockerJob) -> str:
    return json.dumps(job.to_dict(), indent=1, sort_keys=True, default=str)
