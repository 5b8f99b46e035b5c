"""The asyncio client: ``pydvm.aio.Client`` (it lives in :mod:`pydvm.client.aio`).

    async with await pydvm.aio.Client.connect() as c:
        await c.publish({"port": 5555})
        r = await c.lookup(["peer"], wait=True, timeout=10)

Jobs from asyncio: ``pydvm.aio.jobs`` (:mod:`pydvm.client.aiojobs`, loaded
on first use), the twin of :mod:`pydvm.jobs`; ``pydvm.aio.Dvm`` and
``pydvm.aio.Job`` are its classes::

    from pydvm.aio import jobs

    async with await jobs.connect() as dvm:
        result = await dvm.submit("hostname", stdout="capture")
"""

from .client.aio import Client
from .client.proto import Found, LookupResult

__all__ = ["Client", "Dvm", "Found", "Job", "LookupResult", "jobs"]

_LAZY = {"jobs": None, "Dvm": "Dvm", "Job": "Job"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pydvm.aio' has no attribute {name!r}")
    from .client import aiojobs

    value = aiojobs if _LAZY[name] is None else getattr(aiojobs, _LAZY[name])
    globals()[name] = value
    return value
