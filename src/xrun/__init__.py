"""xrun: launch distributed PyTorch jobs.

``import xrun`` is kept cheap (no torch, no yaml, no docker): the runtime agent and the CLI's
start-up both pay for it.
"""

__version__ = "0.1.0"
