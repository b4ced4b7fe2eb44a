"""The ``local_cwd`` scheduler: every replica a process on this host, in the current dir.

One module per role, the same names as in the other scheduler packages: ``scheduler`` (the
:class:`~xrun.schedulers.api.Scheduler`), ``request`` (the dry-run value), ``launch`` (starting
an app), ``supervisor`` (the detached process that owns the replicas), ``status`` (reading an
app's state), ``statedir`` (where an app lives on disk).

The registry imports this package for :func:`create_scheduler`, which needs ``scheduler``
anyway: nothing else is imported here.

``options`` holds the run options as one typed value, :class:`~.options.LocalOptions`.
"""

from .request import LocalRequest, ReplicaRequest, assign_gpus
from .scheduler import LocalCwdScheduler, create_scheduler

__all__ = [
    "LocalCwdScheduler",
    "LocalRequest",
    "ReplicaRequest",
    "assign_gpus",
    "create_scheduler",
]
