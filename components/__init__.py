"""Builtin components: ``dist.*`` and ``utils.*``."""
