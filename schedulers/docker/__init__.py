"""The ``docker`` scheduler: one container per replica, on a private network of its own.

One module per role, the same names as in the other scheduler packages: ``scheduler`` (the
:class:`~xrun.schedulers.api.Scheduler`), ``request`` (the dry-run value), ``engine`` (the docker
SDK calls), ``status`` (reading containers), ``statedir`` (what is kept on disk per app),
``workspace`` (the image build context), ``watch`` (the detached watcher's entry point).

The registry imports this package for :func:`create_scheduler`, which needs ``scheduler``
anyway: nothing else is imported here, and the docker SDK only on first use of the engine.

``options`` holds the run options as one typed value, :class:`~.options.DockerOptions`.
"""

from .options import STOP_TIMEOUT
from .scheduler import DockerScheduler, create_scheduler

__all__ = ["STOP_TIMEOUT", "DockerScheduler", "create_scheduler"]
