"""The workers wing: start this node's worker processes, tee their output, watch them exit.

* ``api.py``: ``start_processes`` -> ``PContext`` (wait, signal, close), ``RunProcsResult``;
* ``streams.py``: ``Std``, which streams a redirect or tee applies to;
* ``worker.py``: the handle of one started process (shared by the two halves below);
* ``launch.py``: the starting half (log files, pipes, fork/exec of each worker);
* ``child.py``: what runs inside a worker between fork and the user's code;
* ``tee.py`` and ``inotify.py``: copy the workers' output to the console.

The public names are ``xrun.runtime.start_processes``, ``PContext``, ``Std`` and
``RunProcsResult``. This file imports nothing on purpose: a function worker's process imports
``xrun.runtime.workers.child`` (multiprocessing finds its target there) and must not pay for
the rest of the wing before the user's code runs.
"""
