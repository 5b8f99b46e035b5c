"""``pydvm.jobs.Executor``: a :class:`concurrent.futures.Executor` whose work items are jobs.

::

    from concurrent.futures import wait
    from pydvm.jobs import Executor

    with Executor(stdout="capture") as ex:          # $PYDVM_URI
        futures = [ex.submit("echo", i) for i in range(10)]
        wait(futures)
        print([f.result().stdout for f in futures])

Where a workflow system expects an Executor (``submit(fn, *args)``,
``map``, ``shutdown``), the "function" is a command and its arguments are
appended to it; each call runs one job on the DVM and returns its
:class:`~pydvm.client.jobs.Job` (a Future resolving to a
:class:`~pydvm.client.jobspec.JobResult`).  No thread per job, no pool: the
jobs run in the DVM, and one connection carries them all.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor as _Executor

from .jobs import Dvm, Job, connect
from .jobspec import split_command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Executor(_Executor):
    """Run commands as jobs of a DVM.

    ``dvm``: a :class:`~pydvm.client.jobs.Dvm` (left open at shutdown), a
    URI, or None (``$PYDVM_URI``; the connection is ours, closed at
    shutdown).  ``defaults``: :meth:`Dvm.submit <pydvm.client.jobs.Dvm.submit>`'s
    keyword arguments for every job (``n``, ``stdout``, ``hosts``,
    ``queue``...), overridden by those given to :meth:`submit`.
    """

    def __init__(self, dvm: "Dvm | str | None" = None, **defaults: Any) -> None:
        if isinstance(dvm, Dvm):
            self.dvm, self._own = dvm, False
        else:
            self.dvm, self._own = connect(dvm), True
        self.defaults = defaults
        self._jobs: set[Job] = set()
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Job:
        """Run ``fn`` (a command: a string split as a shell splits it, or a
        list) with ``args`` (each made a string) appended, as one job;
        ``kwargs`` as :meth:`Dvm.submit <pydvm.client.jobs.Dvm.submit>`'s.
        Returns its :class:`~pydvm.client.jobs.Job`.  RuntimeError after
        :meth:`shutdown`."""
        if args:
            fn = split_command(fn) + [a if isinstance(a, str) else str(a) for a in args]
        opts = {**self.defaults, **kwargs} if kwargs else self.defaults
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit a job after shutdown")
            job = self.dvm.submit(fn, **opts)
            self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return job

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more jobs; with ``cancel_futures``, cancel (kill) those not
        ended; with ``wait``, return once every job has ended.  A connection
        the Executor opened is closed then (without ``wait``, that kills the
        jobs still running)."""
        with self._lock:
            self._shutdown = True
            jobs = list(self._jobs)
        if cancel_futures:
            for job in jobs:
                job.cancel()
        if wait:
            from concurrent.futures import wait as _wait

            _wait(jobs)
        if self._own:
            self.dvm.close()
