"""What the tests share: paths, the CLI runner, ports, waiting, and the real backends' fixtures.

Import the module you need (``from tests.helpers.paths import XRUN``): the fixture modules
(``docker``, ``slurm``) import pytest, the others only the standard library.
"""
