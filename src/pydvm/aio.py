"""The asyncio client: ``pydvm.aio.Client`` (it lives in :mod:`pydvm.client.aio`).

    async with await pydvm.aio.Client.connect() as c:
        await c.publish({"port": 5555})
        r = await c.lookup(["peer"], wait=True, timeout=10)

Jobs from asyncio: ``pydvm.aio.jobs`` (:mod:`pydvm.client.aiojobs`), the
twin of :mod:`pydvm.jobs`; ``pydvm.aio.Dvm`` and ``pydvm.aio.Job`` are its
classes::

    from pydvm.aio import jobs

    async with await jobs.connect() as dvm:
        result = await dvm.submit("hostname", stdout="capture")
"""

from .client import aiojobs as jobs
from .client.aio import Client
from .client.aiojobs import Dvm, Job
from .client.proto import Found, LookupResult

__all__ = ["Client", "Dvm", "Found", "Job", "LookupResult", "jobs"]
