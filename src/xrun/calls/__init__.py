"""Python callables as jobs of any scheduler: ``xrun.submit(fn, *args, scheduler=...)``.

- ``submit.py``  the caller's side: the function pickled by value into the call's folder, the
                 app (``dist.ddp`` running ``python3 -m xrun.calls.worker``), the :class:`Job`
- ``job.py``     :class:`Job` (result, exception, status, cancel, stdout, wait) and
                 :class:`DebugJob` (the function called in this process, for a debugger)
- ``worker.py``  the replica's side, in each rank under the runtime agent: load, call, write
                 the outcome back into the call's folder
- ``files.py``   the call folder's file names and the size-bounded pickle files both sides use

This package's ``__init__`` imports nothing: every worker imports it on start-up.
See docs/from-submitit.md.
"""
