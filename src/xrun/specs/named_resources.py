"""Named resources: ``-h gpu.small`` instead of ``--cpu 8 --gpu 1 --memMB 32768``.

The builtin set: generic sizes, and AWS instance types under TorchX's names::

    cpu.small    1 cpu,  1 GiB        gpu.small    1 GPU,  8 cpu,  32 GiB
    cpu.medium   4 cpu,  8 GiB        gpu.medium   2 GPUs, 16 cpu, 64 GiB
    cpu.large   16 cpu, 32 GiB        gpu.large    4 GPUs, 32 cpu, 128 GiB
    cpu.xlarge  32 cpu, 64 GiB        gpu.xlarge   8 GPUs, 64 cpu, 256 GiB
    cpu.nano     1 cpu, 512 MiB       cpu.micro    1 cpu,  1 GiB

    aws_t3.medium, aws_m5.2xlarge, aws_p3.{2,8,16}xlarge, aws_p3dn.24xlarge,
    aws_p4d.24xlarge, aws_p4de.24xlarge, aws_p5.48xlarge, aws_g4dn.{,2,4,8,12,16}xlarge,
    aws_g4dn.metal, aws_g5.{,2,4,8,12,16,24,48}xlarge, aws_trn1.{2,32}xlarge

The ``aws_*`` figures are TorchX 0.7.0's: memory in "GiB" of 983 MiB (1024 less a 4% allowance
for what the instance itself uses), the instance type as the capability
``node.kubernetes.io/instance-type`` and EFA / Neuron devices in ``devices``. The generic
``cpu.small`` ... ``cpu.xlarge`` are xrun's own sizes (TorchX's are smaller: 1/2/2/8 cpu).

More come from the entry point group ``xrun.named_resources``: each entry point's name is the
resource name and its object a zero-argument callable returning a
:class:`~xrun.specs.Resource`::

    [project.entry-points."xrun.named_resources"]
    "a100.8" = "mypkg.resources:a100_8"

Plugins add names; a plugin name equal to a builtin is ignored (the builtin wins), so a package
cannot silently change what ``gpu.small`` means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xrun.errors import UsageError
from xrun.specs.api import Resource

_GiB = 1024

# name -> (cpu, gpu, memMB)
_BUILTINS: dict[str, tuple[int, int, int]] = {
    "cpu.small": (1, 0, 1 * _GiB),
    "cpu.medium": (4, 0, 8 * _GiB),
    "cpu.large": (16, 0, 32 * _GiB),
    "cpu.xlarge": (32, 0, 64 * _GiB),
    "cpu.nano": (1, 0, 512),
    "cpu.micro": (1, 0, 1 * _GiB),
    "gpu.small": (8, 1, 32 * _GiB),
    "gpu.medium": (16, 2, 64 * _GiB),
    "gpu.large": (32, 4, 128 * _GiB),
    "gpu.xlarge": (64, 8, 256 * _GiB),
}

# TorchX 0.7.0's AWS instance types (torchx/specs/named_resources_aws.py), as data.
_AWS_GiB = int(1024 * 0.96)  # TorchX's "GiB" for these: 4% left to the instance itself
K8S_ITYPE = "node.kubernetes.io/instance-type"
EFA_DEVICE = "vpc.amazonaws.com/efa"
NEURON_DEVICE = "aws.amazon.com/neurondevice"
# instance type -> (cpu, gpu, GiB, EFA devices, Neuron devices)
_AWS: dict[str, tuple[int, int, int, int, int]] = {
    "t3.medium": (2, 0, 4, 0, 0),
    "m5.2xlarge": (8, 0, 32, 0, 0),
    "p3.2xlarge": (8, 1, 61, 0, 0),
    "p3.8xlarge": (32, 4, 244, 0, 0),
    "p3.16xlarge": (64, 8, 488, 0, 0),
    "p3dn.24xlarge": (96, 8, 768, 1, 0),
    "p4d.24xlarge": (96, 8, 1152, 4, 0),
    "p4de.24xlarge": (96, 8, 1152, 4, 0),
    "p5.48xlarge": (192, 8, 2048, 32, 0),
    "g4dn.xlarge": (4, 1, 16, 0, 0),
    "g4dn.2xlarge": (8, 1, 32, 0, 0),
    "g4dn.4xlarge": (16, 1, 64, 0, 0),
    "g4dn.8xlarge": (32, 1, 128, 1, 0),
    "g4dn.16xlarge": (64, 1, 256, 1, 0),
    "g4dn.12xlarge": (48, 4, 192, 1, 0),
    "g4dn.metal": (96, 8, 384, 1, 0),
    "g5.xlarge": (4, 1, 16, 0, 0),
    "g5.2xlarge": (8, 1, 32, 0, 0),
    "g5.4xlarge": (16, 1, 64, 0, 0),
    "g5.8xlarge": (32, 1, 128, 1, 0),
    "g5.16xlarge": (64, 1, 256, 1, 0),
    "g5.12xlarge": (48, 4, 192, 1, 0),
    "g5.24xlarge": (96, 4, 384, 1, 0),
    "g5.48xlarge": (192, 8, 768, 1, 0),
    "trn1.2xlarge": (8, 0, 32, 0, 1),
    "trn1.32xlarge": (128, 0, 512, 8, 16),
}

GROUP = "xrun.named_resources"


def _aws(itype: str) -> Resource:
    cpu, gpu, gib, efa, neuron = _AWS[itype]
    devices = {EFA_DEVICE: efa} if efa else {}
    if neuron:
        devices[NEURON_DEVICE] = neuron
    return Resource(cpu, gpu, gib * _AWS_GiB, {K8S_ITYPE: itype}, devices)


def _plugins() -> dict[str, Any]:
    """Entry points by name; scanned only when a name is not a builtin (the scan is slow)."""
    from importlib.metadata import entry_points  # benchmark 5: plugin names only

    builtin = set(_builtin_names())
    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in builtin}


def _builtin_names() -> list[str]:
    return list(_BUILTINS) + [f"aws_{t}" for t in _AWS]


def names() -> list[str]:
    """Every known name: builtins first, then plugins."""
    return _builtin_names() + sorted(_plugins())


def get_named_resource(name: str) -> Resource:
    """The :class:`Resource` called ``name`` (a fresh copy; callers may change it)."""
    if name in _BUILTINS:
        cpu, gpu, mem = _BUILTINS[name]
        return Resource(cpu=cpu, gpu=gpu, memMB=mem)
    if name.startswith("aws_") and name[4:] in _AWS:
        return _aws(name[4:])
    plugins = _plugins()
    if name in plugins:
        try:
            factory: Callable[[], Any] = plugins[name].load()
            res = factory() if callable(factory) else factory
        except Exception as e:  # a broken plugin must say so, not look like an unknown name
            raise UsageError(f"named resource plugin {name!r} failed to load: {e}") from None
        if not isinstance(res, Resource):
            raise UsageError(
                f"named resource plugin {name!r} returned {type(res).__name__}, expected a Resource"
            )
        return res
    known = _builtin_names() + sorted(plugins)
    import difflib  # benchmark 5: only a misspelt name needs it

    close = difflib.get_close_matches(name, known, n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise UsageError(f"unknown named resource {name!r}{hint}; available: {', '.join(known)}")
