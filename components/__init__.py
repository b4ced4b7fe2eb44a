"""Builtin components: ``dist.*`` and ``utils.*``.

Every public function in these modules that is annotated ``-> AppDef`` is a component, named
``<module>.<function>`` (``dist.ddp``); ``xrun builtins`` lists them.
"""

# The image a builtin component runs in unless told otherwise. The docker scheduler's base
# image carries this name; local_cwd and slurm ignore images (they run in the cwd / job dir).
DEFAULT_IMAGE = "xrun-python:latest"
