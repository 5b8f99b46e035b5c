"""Jobs from Python: ``pydvm.jobs`` (blocking; ``pydvm.aio.jobs`` is the asyncio twin).

::

    import pydvm.jobs

    with pydvm.jobs.connect() as dvm:                      # $PYDVM_URI
        job = dvm.submit("hostname", n=2, stdout="capture")
        print(job.result().stdout)

:func:`connect` attaches to a persistent DVM, :func:`start` starts one
(stopped when its :class:`Dvm` closes); :meth:`Dvm.submit` returns a
:class:`Job`, a :class:`concurrent.futures.Future` of the job's
:class:`JobResult`; :class:`Executor` is a
:class:`concurrent.futures.Executor` running commands as jobs.  The guide
(docs/guide.md, "Jobs from Python") walks through it; the code lives in
:mod:`pydvm.client.jobs`, :mod:`pydvm.client.jobspec` and
:mod:`pydvm.client.executor`.
"""

from .client.executor import Executor
from .client.jobs import Dvm, Job, Subscription, connect, start
from .client.jobspec import (App, JobEvent, JobFailedError, JobInfo, JobResult, JobSpec,
                             NodeInfo, ProcessFailure, ProcessInfo, UnsupportedError)

__all__ = ["App", "Dvm", "Executor", "Job", "JobEvent", "JobFailedError", "JobInfo",
           "JobResult", "JobSpec", "NodeInfo", "ProcessFailure", "ProcessInfo", "Subscription",
           "UnsupportedError", "connect", "start"]
