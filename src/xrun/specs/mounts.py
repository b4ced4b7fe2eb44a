"""Where a role's container sees host paths, volumes and devices: docker-style ``--mount``
strings parsed into :class:`BindMount`, :class:`VolumeMount` and :class:`DeviceMount`."""

from __future__ import annotations

from dataclasses import dataclass

from xrun.errors import UsageError


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
