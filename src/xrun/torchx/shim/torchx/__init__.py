"""xrun's stand-in for TorchX in the workers of a job xrun started, where TorchX is not
installed: only ``torchx.tracker`` (xrun.tracker), so a TorchX script that tracks runs unchanged.

The runtime agent puts this folder's parent on its workers' ``PYTHONPATH`` only when no real
TorchX is importable (runtime/config.py, ``torchx_shim_path``).
"""

__version__ = "0.7.0"
__xrun_stand_in__ = True
