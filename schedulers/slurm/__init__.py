"""The ``slurm`` scheduler: one ``sbatch`` per app, one Slurm task per replica.

One module per role, the same names as in the other scheduler packages: ``scheduler`` (the
:class:`~xrun.schedulers.api.Scheduler`: sbatch, squeue/scontrol/sacct, scancel), ``request``
(the dry-run value: the whole batch script), ``status`` (parsers of what Slurm says about jobs),
``workspace`` (copying a workspace into a job_dir). The replicas' log files are read with the
shared :mod:`xrun.schedulers.logs`.

The registry imports this package for :func:`create_scheduler`, which needs ``scheduler``
anyway: nothing else is imported here.

``options`` holds the run options as one typed value, :class:`~.options.SlurmOptions`.
"""

from .scheduler import SlurmScheduler, create_scheduler, parse_version

__all__ = ["SlurmScheduler", "create_scheduler", "parse_version"]
