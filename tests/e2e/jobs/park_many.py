"""Park more waiting lookups on one connection than its cap allows.

argv[1]: how many to start.  Prints ``PARKED <n>`` (still waiting after a
moment) and ``REFUSED <status name>`` for each one refused, then exits
(closing the connection withdraws the parked ones).
"""

import asyncio
import sys

import pydvm.aio
from pydvm.errors import PMIxError


async def main() -> None:
    n = int(sys.argv[1])
    async with await pydvm.aio.Client.connect() as c:
        tasks = [asyncio.ensure_future(c.lookup([f"never-{i}"], wait=True)) for i in range(n)]
        done, pending = await asyncio.wait(tasks, timeout=2)
        for t in done:
            exc = t.exception()
            if isinstance(exc, PMIxError):
                print("REFUSED", exc.status.pmix_name, flush=True)
            else:
                print("ANSWERED", t.result(), flush=True)
        print("PARKED", len(pending), flush=True)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


asyncio.run(main())
