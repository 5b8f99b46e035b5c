"""The asyncio client: ``pydvm.aio.Client`` (it lives in :mod:`pydvm.client.aio`).

    async with await pydvm.aio.Client.connect() as c:
        await c.publish({"port": 5555})
        r = await c.lookup(["peer"], wait=True, timeout=10)
"""

from .client.aio import Client
from .client.proto import Found, LookupResult

__all__ = ["Client", "Found", "LookupResult"]
