"""Diagnosing a running job from outside its workers: every rank's Python stack (``stacks``,
read by py-spy, no cooperation code in the worker), stacks grouped by where ranks are
(``groups``), the agent's hooks (``watch``: ``xrun stacks`` requests, the stall watchdog,
survivors' stacks in a failure report) and the workers' optional progress beat (``beat``).

Standard library only. Nothing here is imported by ``import xrun.runtime``; the agent imports
``watch`` alone, ``stacks``/``groups`` load when stacks are actually collected.
"""
