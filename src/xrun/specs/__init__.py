"""The specs layer's face: an app is data (an :class:`AppDef` of :class:`Role` s, each with a
:class:`Resource`), and what a scheduler reports back about it (:class:`AppStatus`).

    >>> app = AppDef(name="hello", roles=[Role(name="echo", image="/tmp", entrypoint="echo",
    ...                                        args=["hello ${replica_id}"], num_replicas=2)])
    >>> [macros.Values(img_root="/tmp", app_id="a1", replica_id=str(i), rank0_env="R0").apply(
    ...     app.roles[0]).args for i in range(2)]
    [['hello 0'], ['hello 1']]

Each part has its file (as TorchX's ``torchx/specs/``): ``api`` the dataclasses and states,
``macros``, ``mounts``, ``handles``, ``serial`` (to and from dict/YAML, with ``fields``, the
checkers of a saved spec's fields), ``jobspec`` (``-j``), ``named_resources`` (``-h``).
Import the names from here: ``from xrun.specs import AppDef``. Schedulers turn an AppDef into
a request (see :mod:`xrun.schedulers.api`).
"""

from xrun.specs.api import (
    NULL_RESOURCE,
    AppDef,
    AppState,
    AppStatus,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    is_terminal,
)
from xrun.specs.handles import AppHandle, ParsedAppHandle, make_app_handle, parse_app_handle
from xrun.specs.macros import macros
from xrun.specs.mounts import BindMount, DeviceMount, Mount, VolumeMount, parse_mounts
from xrun.specs.serial import appdef_from_dict, appdef_from_yaml, appdef_to_dict, appdef_to_yaml

__all__ = [
    "NULL_RESOURCE",
    "AppDef",
    "AppHandle",
    "AppState",
    "AppStatus",
    "BindMount",
    "DeviceMount",
    "Mount",
    "ParsedAppHandle",
    "ReplicaStatus",
    "Resource",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "VolumeMount",
    "appdef_from_dict",
    "appdef_from_yaml",
    "appdef_to_dict",
    "appdef_to_yaml",
    "is_terminal",
    "macros",
    "make_app_handle",
    "parse_app_handle",
    "parse_mounts",
]
