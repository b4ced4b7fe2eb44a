"""Schedulers: turn an AppDef into a request value, submit it, report on it."""
