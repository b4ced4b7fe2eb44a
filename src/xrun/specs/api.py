"""The job spec: plain typed dataclasses that know nothing about any scheduler.

An :class:`AppDef` is a list of :class:`Role` s; each role runs ``num_replicas`` copies of one
command (``entrypoint`` + ``args``) in an ``image`` with a :class:`Resource` request::

    >>> app = AppDef(name="hello", roles=[Role(name="echo", image="/tmp", entrypoint="echo",
    ...                                        args=["hello ${replica_id}"], num_replicas=2)])
    >>> [macros.Values(img_root="/tmp", app_id="a1", replica_id=str(i), rank0_env="R0").apply(
    ...     app.roles[0]).args for i in range(2)]
    [['hello 0'], ['hello 1']]

Schedulers turn an AppDef into a request (see :mod:`xrun.schedulers.api`).
"""

from __future__ import annotations

import copy
import enum
import re
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any, NamedTuple

from xrun.contract import MAX_REPLICAS, MAX_RESTARTS
from xrun.errors import UsageError
from xrun.limits import check_count, check_env, check_no_nul, shown
from xrun.yaml_writer import dump


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


# --------------------------------------------------------------------------- mounts
@dataclass
class BindMount:
    """A host path mounted into the replica (``type=bind,src=...,dst=...[,readonly]``)."""

    src_path: str
    dst_path: str
    read_only: bool = False


@dataclass
class VolumeMount:
    """A named volume (``type=volume,src=NAME,dst=...[,readonly]``)."""

    src: str
    dst_path: str
    read_only: bool = False


@dataclass
class DeviceMount:
    """A host device (``type=device,src=/dev/x[,dst=/dev/y][,perm=rwm]``)."""

    src_path: str
    dst_path: str
    permissions: str = "rwm"


Mount = BindMount | VolumeMount | DeviceMount

_MOUNT_FORM = (
    "type=bind,src=HOST_PATH,dst=PATH[,readonly] | type=volume,src=NAME,dst=PATH[,readonly]"
    " | type=device,src=/dev/X[,dst=/dev/Y][,perm=rwm]"
)


def parse_mounts(opts: list[str]) -> list[Mount]:
    """Parse docker-style ``--mount`` strings; several may be comma-joined items of one list.

    ``["type=bind,src=/a,dst=/b,readonly", "type=volume,src=v,dst=/c"]``. A new mount starts at
    every ``type=`` so a list split on commas (as the CLI does for ``list[str]``) also works.
    """
    groups: list[list[str]] = []
    for opt in opts:
        for item in opt.split(","):
            item = item.strip()
            if not item:
                continue
            if item.startswith("type=") or not groups:
                groups.append([])
            groups[-1].append(item)
    return [_parse_one_mount(g) for g in groups]


# Every spelling a mount key has in docker's and TorchX's forms -> the one used below.
_MOUNT_KEYS = {"source": "src", "destination": "dst", "target": "dst", "permissions": "perm"}


def _mount_items(items: list[str]) -> tuple[dict[str, str], bool, set[str]]:
    """``key=value`` items -> (values by canonical key, read-only?, unknown bare flags)."""
    kv: dict[str, str] = {}
    flags: set[str] = set()
    read_only = False
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            read_only |= key in ("readonly", "ro")
            flags.add(key)
        elif key in ("readonly", "ro"):
            read_only |= value.lower() in ("true", "1", "yes")
        else:
            kv[_MOUNT_KEYS.get(key, key)] = value
    return kv, read_only, flags - {"readonly", "ro"}


def _parse_one_mount(items: list[str]) -> Mount:
    text = ",".join(items)
    kv, read_only, unknown = _mount_items(items)
    kind = kv.get("type")
    if kind is None:
        raise UsageError(f"mount {text!r} has no type=; expected {_MOUNT_FORM}")
    if unknown:
        raise UsageError(
            f"mount {text!r}: unknown flag {sorted(unknown)[0]!r}; expected {_MOUNT_FORM}"
        )
    if kind in ("bind", "volume"):
        if not kv.get("src") or not kv.get("dst"):
            raise UsageError(f"{kind} mount {text!r} needs src= and dst=; expected {_MOUNT_FORM}")
        if kind == "bind":
            return BindMount(src_path=kv["src"], dst_path=kv["dst"], read_only=read_only)
        return VolumeMount(src=kv["src"], dst_path=kv["dst"], read_only=read_only)
    if kind == "device":
        if not kv.get("src"):
            raise UsageError(f"device mount {text!r} needs src=; expected {_MOUNT_FORM}")
        perm = kv.get("perm", "rwm")
        if not perm or set(perm) - set("rwm"):
            raise UsageError(f"device mount {text!r}: perm={perm!r} must use only r, w, m")
        return DeviceMount(src_path=kv["src"], dst_path=kv.get("dst", kv["src"]), permissions=perm)
    raise UsageError(f"mount {text!r}: unknown type {kind!r}; expected {_MOUNT_FORM}")


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


# --------------------------------------------------------------------------- macros
class macros:  # noqa: N801 - a namespace, named like TorchX's for familiarity
    """Placeholders a scheduler fills in per replica, in ``args`` and ``env`` values.

    ``${app_id}``, ``${replica_id}``, ``${img_root}``, ``${rank0_env}`` (the *name* of an env var
    whose value is the first replica's host). Unknown ``${x}`` are left alone; ``$$`` is ``$``.
    """

    app_id = "${app_id}"
    replica_id = "${replica_id}"
    img_root = "${img_root}"
    rank0_env = "${rank0_env}"

    _PATTERN = re.compile(r"\$\$|\$\{(app_id|replica_id|img_root|rank0_env)\}")

    @dataclass
    class Values:
        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str

        def substitute(self, text: str) -> str:
            if "$" not in text:
                return text
            # The fields as they are: asdict() deep-copies them, once per substituted string,
            # which was half the time of a 16,384-replica dry run.
            values = vars(self)

            def repl(m: re.Match[str]) -> str:
                return "$" if m.group(0) == "$$" else str(values[m.group(1)])

            return macros._PATTERN.sub(repl, text)

        def fill(self, role: Role) -> tuple[list[str], dict[str, str]]:
            """``role``'s args and env with every macro substituted (new list and dict; the role
            is not copied: a scheduler that needs only these skips a deep copy per replica)."""
            return (
                [self.substitute(a) for a in role.args],
                {k: self.substitute(v) for k, v in role.env.items()},
            )

        def apply(self, role: Role) -> Role:
            """A copy of ``role`` with every macro substituted; ``role`` itself is untouched."""
            out = copy.deepcopy(role)
            out.args, out.env = self.fill(out)
            return out


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


# --------------------------------------------------------------------------- handles
_HANDLE_FORM = "SCHEDULER://SESSION/APP_ID (e.g. local_cwd://default/ddp-x1y2z3)"
_HANDLE_RE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)://([A-Za-z0-9_.-]*)/([^/\s]+)$")


@dataclass(frozen=True)
class AppHandle:
    """``scheduler://session/app_id``: how every command after ``run`` finds a job."""

    scheduler: str
    session: str
    app_id: str

    @staticmethod
    def parse(text: str) -> AppHandle:
        m = _HANDLE_RE.match(text.strip())
        if not m:
            raise UsageError(f"malformed app handle {text!r}; expected {_HANDLE_FORM}")
        return AppHandle(m.group(1), m.group(2), m.group(3))

    def __str__(self) -> str:
        return f"{self.scheduler}://{self.session}/{self.app_id}"


class ParsedAppHandle(NamedTuple):
    """A handle's three parts, named and ordered as TorchX's (``scheduler, session, app_id =
    parse_app_handle(h)`` works)."""

    scheduler_backend: str
    session_name: str
    app_id: str


def make_app_handle(scheduler_backend: str, session_name: str, app_id: str) -> str:
    """``scheduler_backend://session_name/app_id``: TorchX's function, in TorchX's argument
    order, so that code ported from TorchX builds the same handle."""
    return str(AppHandle(scheduler_backend, session_name, app_id))


def parse_app_handle(text: str) -> ParsedAppHandle:
    """The parts of a handle as a 3-tuple (TorchX's ``ParsedAppHandle``); UsageError if
    malformed."""
    h = AppHandle.parse(text)
    return ParsedAppHandle(h.scheduler, h.session, h.app_id)


# --------------------------------------------------------------------------- YAML
def appdef_to_dict(app: AppDef) -> dict[str, Any]:
    """A plain dict (enums as names, mounts tagged with their type) for YAML/JSON."""
    roles = []
    for r in app.roles:
        d = asdict(r)
        d["retry_policy"] = r.retry_policy.value
        d["mounts"] = [_mount_to_dict(m) for m in r.mounts]
        roles.append(d)
    return {"name": app.name, "roles": roles, "metadata": dict(app.metadata)}


def _mount_to_dict(m: Mount) -> dict[str, Any]:
    kind = {BindMount: "bind", VolumeMount: "volume", DeviceMount: "device"}[type(m)]
    return {"type": kind, **asdict(m)}


_ROLE_FIELDS = set(Role.__dataclass_fields__)
_RESOURCE_FIELDS = ("cpu", "gpu", "memMB", "capabilities", "devices")
_MOUNT_TYPES: dict[str, type[Mount]] = {
    "bind": BindMount,
    "volume": VolumeMount,
    "device": DeviceMount,
}


def appdef_from_dict(data: Any, source: str = "spec") -> AppDef:
    """Build an AppDef from :func:`appdef_to_dict`'s form (a saved YAML spec, a scheduler's
    record), checking every field's type: a wrong one is a UsageError naming the field
    (``spec.yaml: roles[0].num_replicas: expected an integer, got a string 'abc'``)."""
    from xrun import fields as f  # benchmark 5: a saved AppDef only (datetime)

    if not isinstance(data, dict) or "name" not in data or "roles" not in data:
        got = f.type_name(data)
        raise UsageError(
            f"{source}: expected a mapping with 'name' and 'roles' (an AppDef), got {got}"
        )
    f.check_size(data, source)
    unknown = set(data) - {"name", "roles", "metadata"}
    if unknown:
        raise UsageError(
            f"{source}: unknown field {sorted(map(str, unknown))[0]!r}; valid: metadata, name, roles"
        )
    roles = [
        _role_from_dict(rd, f"{source}: roles[{i}]")
        for i, rd in enumerate(f.as_list(data["roles"], f"{source}: roles"))
    ]
    app = AppDef(
        name=f.as_str(data["name"], f"{source}: name"),
        roles=roles,
        metadata=f.as_str_map(data.get("metadata"), f"{source}: metadata"),
    )
    try:
        app.validate()
    except UsageError as e:
        raise UsageError(f"{source}: {e}") from None
    return app


def _role_from_dict(rd: Any, where: str) -> Role:
    from xrun import fields as f  # benchmark 5: a saved AppDef only (datetime)

    rd = f.as_map(rd, where)
    unknown = set(rd) - _ROLE_FIELDS
    if unknown:
        raise UsageError(
            f"{where}: unknown field {sorted(map(str, unknown))[0]!r}; "
            f"valid: {', '.join(sorted(_ROLE_FIELDS))}"
        )
    for key in ("name", "image"):  # required: Role has no default for them
        if rd.get(key) is None:
            raise UsageError(f"{where}: the role has no {key}; add {key}: {key.upper()}")
    kw: dict[str, Any] = {"name": f.as_str(rd["name"], f"{where}.name")}
    for key in ("image", "entrypoint"):
        if rd.get(key) is not None:
            kw[key] = f.as_str(rd[key], f"{where}.{key}")
    kw["args"] = f.as_str_list(rd.get("args"), f"{where}.args")
    kw["env"] = f.as_str_map(rd.get("env"), f"{where}.env")
    for key in ("num_replicas", "min_replicas", "max_retries"):  # ranges: Role.validate
        if rd.get(key) is not None:
            kw[key] = f.as_int(rd[key], f"{where}.{key}")
    if rd.get("retry_policy") is not None:
        try:
            kw["retry_policy"] = RetryPolicy(rd["retry_policy"])
        except ValueError:
            raise UsageError(
                f"{where}.retry_policy: {rd['retry_policy']!r}; expected one of "
                f"{[p.value for p in RetryPolicy]}"
            ) from None
    if rd.get("resource") is not None:
        kw["resource"] = _resource_from_dict(rd["resource"], f"{where}.resource")
    kw["port_map"] = {
        f.as_str(k, f"{where}.port_map key"): f.as_int(v, f"{where}.port_map.{k}", 0, 65535)
        for k, v in f.as_map(rd.get("port_map"), f"{where}.port_map").items()
    }
    kw["mounts"] = [
        _mount_from_dict(m, f"{where}.mounts[{i}]")
        for i, m in enumerate(f.as_list(rd.get("mounts"), f"{where}.mounts"))
    ]
    kw["metadata"] = {
        f.as_str(k, f"{where}.metadata key"): v
        for k, v in f.as_map(rd.get("metadata"), f"{where}.metadata").items()
    }
    return Role(**kw)


def _resource_from_dict(res: Any, where: str) -> Resource:
    from xrun import fields as f  # benchmark 5: a saved AppDef only (datetime)

    res = f.as_map(res, where)
    unknown = set(res) - set(_RESOURCE_FIELDS)
    if unknown:
        raise UsageError(
            f"{where}: unknown field {sorted(map(str, unknown))[0]!r}; "
            f"valid: {', '.join(_RESOURCE_FIELDS)}"
        )
    ints = {k: f.as_int(res.get(k, -1), f"{where}.{k}", -1) for k in ("cpu", "gpu", "memMB")}
    devices = {
        f.as_str(k, f"{where}.devices key"): f.as_int(v, f"{where}.devices.{k}", 0)
        for k, v in f.as_map(res.get("devices"), f"{where}.devices").items()
    }
    caps = {
        f.as_str(k, f"{where}.capabilities key"): v
        for k, v in f.as_map(res.get("capabilities"), f"{where}.capabilities").items()
    }
    return Resource(ints["cpu"], ints["gpu"], ints["memMB"], caps, devices)


def _mount_from_dict(d: Any, where: str) -> Mount:
    from xrun import fields as f  # benchmark 5: a saved AppDef only (datetime)

    d = dict(f.as_map(d, where))
    kind = d.pop("type", None)
    cls = _MOUNT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UsageError(
            f"{where}: unknown mount type {kind!r}; expected type: bind, volume or device"
        )
    fields_ = cls.__dataclass_fields__
    unknown = set(d) - set(fields_)
    if unknown:
        raise UsageError(
            f"{where}: unknown field {sorted(map(str, unknown))[0]!r} for a {kind} mount; "
            f"valid: type, {', '.join(fields_)}"
        )
    kw: dict[str, Any] = {}
    for key, value in d.items():
        if key == "read_only":
            if not isinstance(value, bool):
                raise f.fail(f"{where}.read_only", value, "true or false")
            kw[key] = value
        else:
            kw[key] = f.as_str(value, f"{where}.{key}")
    try:
        return cls(**kw)
    except TypeError:  # a required path missing
        need = [k for k, v in fields_.items() if v.default is MISSING]
        raise UsageError(f"{where}: a {kind} mount needs {' and '.join(need)}") from None


def appdef_to_yaml(app: AppDef) -> str:
    """The YAML text ``xrun run --dryrun`` prints and ``appdef_from_yaml`` reads back."""
    return dump(appdef_to_dict(app))


def appdef_from_yaml(text: str, source: str = "spec") -> AppDef:
    import yaml  # benchmark 5: pyyaml alone costs a third of a dry run; reading only

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else "invalid YAML"
        raise UsageError(f"{source}: not valid YAML ({first})") from None
    except ValueError as e:  # an int past Python's 4,300 digits, a date like 2024-13-45
        why = str(e).split(";")[0]
        raise UsageError(f"{source}: a value in it cannot be read ({why})") from None
    except RecursionError:  # lists nested thousands deep
        raise UsageError(f"{source}: its YAML is nested too deeply to be an AppDef") from None
    return appdef_from_dict(data, source)
