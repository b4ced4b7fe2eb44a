"""Sweeps: a grid of trials under one handle (``xrun run --sweep``).

=================  ============================================================================
``plan``           the ``Sweep`` spec (grid, sweep file), ``{{name}}`` placeholders, the
                   ``SweepPlan`` (one template AppDef, or one per trial)
``status``         one row per trial, the sweep's state folded from its trials', the table
``records``        ``$XDG_STATE_HOME/xrun/sweeps/<scheduler>/<id>/``: how any shell finds a sweep
``backend``        the ``SweepBackend`` interface a scheduler implements to run a sweep its own
                   way (``Scheduler.sweep_backend()``; Slurm: one job array)
``trials``         every other scheduler: each trial an ordinary app, at most K at once, under
``supervisor``     a detached sweep supervisor
``handles``        one resolver: any handle names an app, a sweep, or a trial (``SWEEP/TRIAL``)
=================  ============================================================================
"""
