"""Running TorchX component files unchanged: ``xrun run path/to/file.py:fn``.

A component file written for TorchX imports TorchX::

    import torchx
    import torchx.specs as specs
    from torchx.components.dist import ddp

**TorchX not installed** (the usual case): while xrun loads such a file, and while its
component function runs, those imports resolve to xrun's equivalents (:func:`torchx_imports`):
``torchx.specs`` is :mod:`xrun.specs` plus TorchX's helpers (``resource``, ``named_resources``,
``get_named_resources``, ``MISSING``, ``NONE``, ...), ``torchx.components.dist`` and
``torchx.components.utils`` are xrun's builtins, ``torchx.tracker`` (and ``.api``) is
:mod:`xrun.tracker`, ``torchx.IMAGE`` is xrun's default image. They
are ``sys.modules`` entries put in place for that time only and removed after: ``import
torchx`` anywhere else still fails, and so does a TorchX module xrun does not stand in for
(``torchx.schedulers``, ...), with a message naming what xrun provides. Write ``Role`` with
keyword arguments (xrun's positional order differs from TorchX's).

**TorchX installed**: the file imports the real TorchX, and the ``AppDef`` its component
returns is converted to xrun's (:func:`from_torchx`). A TorchX ``dist.ddp`` then runs
``torchrun`` in the replicas (which need torch), with the scheduler owning its retries.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xrun import specs
from xrun.components import DEFAULT_IMAGE, dist, utils
from xrun.components.dist import split_name
from xrun.errors import UsageError
from xrun.schedulers import api, options
from xrun.specs import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
    named_resources,
)
from xrun.specs.named_resources import get_named_resource, names
from xrun.torchx.stand_ins import MORE_STAND_INS, LazyStandIns, add_stand_ins

TORCHX_VERSION = "0.7.0"  # the TorchX whose API the stand-ins follow
# The modules xrun stands in for (anything else under torchx. is refused with this list).
STAND_INS = (
    "torchx",
    "torchx.specs",
    "torchx.specs.api",
    "torchx.specs.named_resources_aws",
    "torchx.components",
    "torchx.components.dist",
    "torchx.components.utils",
    "torchx.components.structured_arg",
    "torchx.tracker",
    "torchx.tracker.api",
)
MISSING = "<MISSING>"
NONE = "<NONE>"
ALL = "all"
# Where xrun's worker-side `torchx` stand-in lives (runtime/config.py, `torchx_shim_path`).
_SHIM_MARK = os.path.join("xrun", "torchx", "shim", "torchx")


def torchx_installed() -> bool:
    """Is the real TorchX importable (so that no stand-in must be used)?"""
    module = sys.modules.get("torchx")
    if module is not None:
        return not getattr(module, "__xrun_stand_in__", False)
    spec = importlib.util.find_spec("torchx")
    # xrun's own worker-side stand-in (xrun/torchx/shim) is no TorchX
    return spec is not None and _SHIM_MARK not in (spec.origin or "")


# --------------------------------------------------------------------------- TorchX's helpers
def resource(
    cpu: int | None = None, gpu: int | None = None, memMB: int | None = None, h: str | None = None
) -> Any:
    """TorchX's ``specs.resource``: the named resource ``h``, else cpu/gpu/memMB with TorchX's
    defaults (2 CPUs, 0 GPUs, 1024 MB) for the ones not given (or 0)."""
    if h:
        return get_named_resource(h)
    return Resource(cpu=cpu or 2, gpu=gpu or 0, memMB=memMB or 1024)


class _NamedResources:
    """TorchX's ``specs.named_resources``: ``named_resources["aws_p4d.24xlarge"]``."""

    def __getitem__(self, name: str) -> Any:
        try:
            return get_named_resource(name)
        except UsageError as e:
            raise KeyError(str(e)) from None

    def __contains__(self, name: object) -> bool:
        return name in names()


@dataclass
class StructuredNameArgument:
    """TorchX's ``--name EXPERIMENT/RUN`` (see :func:`xrun.components.dist.split_name`)."""

    experiment_name: str
    run_name: str

    def __str__(self) -> str:
        return f"{self.experiment_name or ''}/{self.run_name}"

    @staticmethod
    def parse_from(
        name: str,
        m: str | None = None,
        script: str | None = None,
        default_experiment_name: str = "default-experiment",
    ) -> StructuredNameArgument:
        if bool(m) == bool(script):
            raise ValueError("specify exactly one of a main module (m) or a script")
        given = name.partition("/")[0] if "/" in name else ""
        return StructuredNameArgument(
            given or default_experiment_name, split_name(name, script, m)[1]
        )


@dataclass
class StructuredJArgument:
    """TorchX's ``-j NNODES[xNPROC]`` for a named resource (NPROC defaults to its GPUs)."""

    nnodes: int
    nproc_per_node: int

    def __str__(self) -> str:
        return f"{self.nnodes}x{self.nproc_per_node}"

    @staticmethod
    def parse_from(h: str, j: str) -> StructuredJArgument:
        gpus = get_named_resource(h).gpu
        nnodes, x, nproc = j.partition("x")
        if not x and gpus <= 0:
            raise ValueError(f"-j {j}: {h} has no GPUs to infer the processes per node from")
        return StructuredJArgument(int(nnodes), int(nproc) if x else gpus)


# --------------------------------------------------------------------------- the stand-ins
def _module(name: str, attrs: Mapping[str, Any], package: bool = False) -> types.ModuleType:
    mod = types.ModuleType(name, f"xrun's stand-in for TorchX {TORCHX_VERSION}'s {name}")
    # not another module's dunders (vars(dist) holds __name__, __file__, ...); __version__ is API
    mod.__dict__.update(
        {k: v for k, v in attrs.items() if not k.startswith("__") or k == "__version__"}
    )
    mod.__xrun_stand_in__ = True  # type: ignore[attr-defined]
    if package:
        mod.__path__ = []  # a package: `import torchx.specs` looks for submodules
    return mod


def _specs_attrs() -> dict[str, Any]:
    # Every public name of the files behind xrun.specs' face (what the one specs.py module
    # held before it became a package), not the package's submodules themselves.
    attrs = {
        n: getattr(part, n)
        for part in (specs.api, specs.mounts, specs.handles, specs.serial)
        for n in dir(part)
        if not n.startswith("_")
    }
    attrs["macros"] = specs.macros
    attrs.update(
        CfgVal=options.CfgVal,
        AppDryRunInfo=api.AppDryRunInfo,
        runopt=options.runopt,
        runopts=options.runopts,
        MISSING=MISSING,
        NONE=NONE,
        ALL=ALL,
        resource=resource,
        named_resources=_NamedResources(),
        get_named_resources=named_resources.get_named_resource,
        GiB=1024,
    )
    return attrs


def _stand_ins() -> dict[str, types.ModuleType]:
    specs_attrs = _specs_attrs()
    aws = {
        n: (lambda n=n: named_resources.get_named_resource(n))
        for n in named_resources.names()
        if n.startswith("aws_")
    }
    mods = {
        "torchx.specs.api": _module("torchx.specs.api", specs_attrs),
        "torchx.specs.named_resources_aws": _module(
            "torchx.specs.named_resources_aws",
            {
                "NAMED_RESOURCES": aws,
                "K8S_ITYPE": named_resources.K8S_ITYPE,
                "EFA_DEVICE": named_resources.EFA_DEVICE,
                "NEURON_DEVICE": named_resources.NEURON_DEVICE,
            },
        ),
        "torchx.components.dist": _module("torchx.components.dist", vars(dist)),
        "torchx.components.utils": _module("torchx.components.utils", vars(utils)),
        "torchx.components.structured_arg": _module(
            "torchx.components.structured_arg",
            {
                "StructuredNameArgument": StructuredNameArgument,
                "StructuredJArgument": StructuredJArgument,
            },
        ),
    }
    # benchmark 5: TorchX files that track only
    from xrun.tracker import api as tracker_api

    mods["torchx.tracker.api"] = _module("torchx.tracker.api", vars(tracker_api))
    tracker = _module("torchx.tracker", vars(tracker_api), package=True)
    tracker.api = mods["torchx.tracker.api"]  # type: ignore[attr-defined]
    mods["torchx.tracker"] = tracker
    specs = _module("torchx.specs", specs_attrs, package=True)
    specs.api = mods["torchx.specs.api"]  # type: ignore[attr-defined]
    specs.named_resources_aws = mods["torchx.specs.named_resources_aws"]  # type: ignore[attr-defined]
    components = _module(
        "torchx.components",
        {k.rpartition(".")[2]: v for k, v in mods.items() if k.startswith("torchx.components.")},
        package=True,
    )
    top = _module(
        "torchx",
        {
            "__version__": TORCHX_VERSION,
            "IMAGE": DEFAULT_IMAGE,
            "specs": specs,
            "components": components,
            "tracker": tracker,
        },
        package=True,
    )
    return {"torchx": top, "torchx.specs": specs, "torchx.components": components, **mods}


class _RefuseOthers(importlib.abc.MetaPathFinder):
    """A TorchX module xrun does not stand in for: a clear ImportError, not a bare one."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> None:
        if fullname == "torchx" or fullname.startswith("torchx."):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: TorchX is not installed, and xrun stands in "
                f"only for {', '.join(STAND_INS + MORE_STAND_INS)} (pip install "
                f"torchx=={TORCHX_VERSION} for the rest)",
                name=fullname,
            )
        return None


@contextlib.contextmanager
def torchx_imports() -> Iterator[None]:
    """While active, ``import torchx...`` gives xrun's stand-ins (unless TorchX is installed,
    or the stand-ins are already in place: nesting is a no-op)."""
    undo = install_stand_ins()
    try:
        yield
    finally:
        if undo is not None:
            undo()


def install_stand_ins() -> Callable[[], None] | None:
    """Put the stand-ins in place; returns what takes them away again (None, and nothing
    done, when TorchX is installed or the stand-ins are already in place)."""
    if "torchx" in sys.modules or torchx_installed():
        return None
    modules = add_stand_ins(_stand_ins())
    refuse, lazy = _RefuseOthers(), LazyStandIns()
    sys.modules.update(modules)
    sys.meta_path[:0] = [lazy, refuse]

    def undo() -> None:
        sys.meta_path.remove(refuse)
        sys.meta_path.remove(lazy)
        for name in [n for n in sys.modules if n == "torchx" or n.startswith("torchx.")]:
            if getattr(sys.modules[name], "__xrun_stand_in__", False):
                del sys.modules[name]  # the lazily made ones (torchx.runner) too

    return undo


def scoped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run inside :func:`torchx_imports` (a component function of a TorchX file may
    import TorchX when called); signature, docstring and annotations are ``fn``'s."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with torchx_imports():
            return fn(*args, **kwargs)

    return call


# --------------------------------------------------------------------------- TorchX's AppDef
def from_torchx(app: Any) -> Any:
    """A real TorchX ``AppDef`` as xrun's (its fields have the same names and meanings)."""
    return AppDef(
        name=str(app.name),
        roles=[
            Role(
                name=r.name,
                image=r.image,
                entrypoint=r.entrypoint,
                args=[str(a) for a in r.args],
                env={str(k): str(v) for k, v in r.env.items()},
                num_replicas=r.num_replicas,
                min_replicas=r.min_replicas,
                max_retries=r.max_retries,
                retry_policy=_retry_policy(r.retry_policy),
                resource=_resource(r.resource),
                port_map=dict(r.port_map),
                mounts=[_mount(m) for m in r.mounts],
                metadata=dict(r.metadata),
            )
            for r in app.roles
        ],
        metadata=dict(app.metadata),
    )


def _retry_policy(policy: Any) -> Any:
    return RetryPolicy(getattr(policy, "value", policy))


def _resource(res: Any) -> Any:
    return Resource(res.cpu, res.gpu, res.memMB, dict(res.capabilities), dict(res.devices))


def _mount(m: Any) -> Any:
    kind = type(m).__name__
    if kind == "BindMount":
        return BindMount(m.src_path, m.dst_path, m.read_only)
    if kind == "VolumeMount":
        return VolumeMount(m.src, m.dst_path, m.read_only)
    if kind == "DeviceMount":
        return DeviceMount(m.src_path, m.dst_path, m.permissions)
    raise UsageError(f"TorchX mount {m!r} has no xrun equivalent (bind, volume or device)")
