"""The TorchX annex: what lets code written for TorchX run on xrun unchanged, in one folder.

- :mod:`.compat`: TorchX component files (``xrun run file.py:fn``): the ``torchx`` stand-ins,
  only while such a file loads and runs; a real TorchX AppDef converted;
- :mod:`.stand_ins`: the rest of TorchX's API as stand-ins (``torchx.schedulers``,
  ``torchx.runner``, ``torchx.specs.finder``/``builders``, ...), made by name on first import;
- :mod:`.finder`: ``torchx.specs.finder``/``builders`` over :mod:`xrun.component`;
- ``shim/``: no module of this package but a folder the runtime agent puts on its workers'
  ``PYTHONPATH`` (a top-level ``torchx`` package with only ``torchx.tracker``) when no real
  TorchX is installed (``xrun.runtime.config.torchx_shim_path``).

Nothing here is imported unless a TorchX file, script or import asks for it (benchmark 5).
"""
