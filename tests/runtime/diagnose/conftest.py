"""Fixtures of the diagnose tests: the agent tests' ``procs`` (agents killed at the end)."""

from tests.runtime.agent.conftest import procs

__all__ = ["procs"]
