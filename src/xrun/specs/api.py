"""The job spec: plain typed dataclasses that know nothing about any scheduler (an
:class:`AppDef` is a list of :class:`Role` s; each role runs ``num_replicas`` copies of one
command, ``entrypoint`` + ``args``, in an ``image`` with a :class:`Resource` request), and the
states a scheduler reports (:class:`AppState`, :class:`AppStatus`)."""

from __future__ import annotations

import copy
import enum
import re
from dataclasses import dataclass, field
from typing import Any

from xrun.contract import MAX_REPLICAS, MAX_RESTARTS
from xrun.errors import UsageError
from xrun.limits import check_count, check_env, check_no_nul, shown
from xrun.specs.mounts import Mount


# --------------------------------------------------------------------------- resources
@dataclass
class Resource:
    """What one replica asks for. ``memMB`` keeps TorchX's name for familiarity."""

    cpu: int
    gpu: int
    memMB: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """A copy of ``original`` with extra capabilities merged in."""
        merged = {**original.capabilities, **capabilities}
        return Resource(original.cpu, original.gpu, original.memMB, merged, dict(original.devices))


# A Role without a resource request: schedulers leave the limits to their defaults.
NULL_RESOURCE = Resource(cpu=-1, gpu=-1, memMB=-1)


# --------------------------------------------------------------------------- roles & apps
class RetryPolicy(str, enum.Enum):
    """What a scheduler restarts when a replica fails (TorchX's names; ROLE is xrun's)."""

    REPLICA = "REPLICA"
    APPLICATION = "APPLICATION"
    ROLE = "ROLE"
    HOT_SPARE = "HOT_SPARE"


@dataclass
class Role:
    """One kind of replica: ``num_replicas`` copies of ``entrypoint args...`` in ``image``.

    ``min_replicas`` (< num_replicas) makes the role elastic. ``port_map`` names ports the
    replica listens on. ``metadata`` is free-form, per scheduler.
    """

    name: str
    image: str
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=lambda: copy.deepcopy(NULL_RESOURCE))
    port_map: dict[str, int] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name
        ):
            raise UsageError(
                f"role name {self.name!r} is invalid; use letters, digits, '_', '.', '-'"
            )
        if not self.entrypoint:
            raise UsageError(f"role {self.name!r} has no entrypoint")
        self._validate_counts()
        where = f"role {self.name!r}"
        if not all(isinstance(a, str) for a in self.args):
            raise UsageError(f"{where}: args must be strings, got {self.args!r:.200}")
        check_env(self.env, f"{where}: env")
        check_no_nul([self.entrypoint, *self.args], f"{where}: argument")
        for port_name, port in self.port_map.items():
            if not _is_int(port) or not 0 <= port <= 65535:
                raise UsageError(f"{where}: port_map {port_name}={port!r} must be 0..65535")

    def _validate_counts(self) -> None:
        where = f"role {self.name!r}"
        for key in ("num_replicas", "max_retries"):
            if not _is_int(getattr(self, key)):
                raise UsageError(f"{where}: {key}={getattr(self, key)!r:.80} must be an integer")
        if self.num_replicas < 1:
            raise UsageError(f"{where}: num_replicas={self.num_replicas} must be >= 1")
        if self.num_replicas > MAX_REPLICAS:
            raise UsageError(
                f"{where}: num_replicas={shown(self.num_replicas)} is over the limit of "
                f"{MAX_REPLICAS:,} replicas per role"
            )
        if self.min_replicas is not None and not (
            _is_int(self.min_replicas) and 0 <= self.min_replicas <= self.num_replicas
        ):
            raise UsageError(
                f"{where}: min_replicas={shown(self.min_replicas)} must be between 0 and "
                f"num_replicas={self.num_replicas}"
            )
        # At most the agent's --max-restarts limit: refused here, not inside the job.
        check_count(self.max_retries, f"{where}: max_retries", MAX_RESTARTS, lo=0)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class AppDef:
    """A job: a name, its roles and free-form metadata."""

    name: str
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if not isinstance(self.name, str):
            raise UsageError(f"app name {self.name!r:.80} must be a string")
        if not self.name.strip():  # the app id is made from it
            raise UsageError(f"app name {self.name!r} is empty; give the app a name, e.g. train")
        if not self.roles:
            raise UsageError(f"app {self.name!r} has no roles")
        seen: set[str] = set()
        for role in self.roles:
            role.validate()
            if role.name in seen:
                raise UsageError(f"app {self.name!r}: two roles are named {role.name!r}")
            seen.add(role.name)


# --------------------------------------------------------------------------- status
class AppState(int, enum.Enum):
    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name


_TERMINAL = {AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED}


def is_terminal(state: AppState) -> bool:
    return state in _TERMINAL


@dataclass
class ReplicaStatus:
    id: int
    state: AppState
    role: str
    hostname: str = ""
    exit_code: int | None = None
    structured_error_msg: str = ""


@dataclass
class RoleStatus:
    role: str
    replicas: list[ReplicaStatus] = field(default_factory=list)


@dataclass
class AppStatus:
    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles: list[RoleStatus] = field(default_factory=list)

    def is_terminal(self) -> bool:
        return is_terminal(self.state)

    def format(self) -> str:
        """Human-readable multi-line status (what ``xrun status`` prints)."""
        lines = [f"State: {self.state.name}"]
        if self.num_restarts:
            lines.append(f"Restarts: {self.num_restarts}")
        if self.msg:
            lines.append(f"Msg: {self.msg}")
        if self.ui_url:
            lines.append(f"UI: {self.ui_url}")
        for role in self.roles:
            lines.append(f"Role {role.role}:")
            for r in role.replicas:
                code = "" if r.exit_code is None else f" exit_code={r.exit_code}"
                host = f" host={r.hostname}" if r.hostname else ""
                lines.append(f"  {role.role}/{r.id}: {r.state.name}{host}{code}")
                if r.structured_error_msg:
                    lines.append(f"    error: {r.structured_error_msg.splitlines()[0][:300]}")
        if self.structured_error_msg:
            lines.append(f"Error: {self.structured_error_msg.splitlines()[0][:300]}")
        return "\n".join(lines)
