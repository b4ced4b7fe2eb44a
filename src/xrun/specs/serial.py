"""An AppDef to and from a plain dict and YAML (a saved spec, a scheduler's record), every
field's type checked on the way in (the checkers are :mod:`xrun.specs.fields`, loaded only
when a saved AppDef is read)."""

from __future__ import annotations

from dataclasses import MISSING, asdict
from typing import Any

from xrun.errors import UsageError
from xrun.specs.api import AppDef, Resource, RetryPolicy, Role
from xrun.specs.mounts import BindMount, DeviceMount, Mount, VolumeMount
from xrun.yaml_writer import dump


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
    from xrun.specs import fields as f  # benchmark 5: a saved AppDef only (datetime)

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
    from xrun.specs import fields as f  # benchmark 5: a saved AppDef only (datetime)

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
    from xrun.specs import fields as f  # benchmark 5: a saved AppDef only (datetime)

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
    from xrun.specs import fields as f  # benchmark 5: a saved AppDef only (datetime)

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
