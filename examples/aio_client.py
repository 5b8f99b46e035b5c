"""The asyncio client: several requests in flight on one connection.

Run it (from the top of the repository)::

    pydvm run -n 3 python3 examples/aio_client.py

What it shows: ``pydvm.aio.Client`` in a program that does other work while
it waits.  Each rank starts a waiting lookup for the ``ready-*`` keys of all
ranks as a task, and while that lookup is parked in the store it publishes
its own ``ready-<rank>`` on the same connection.  It then gives up on a key
nobody publishes with ``asyncio.wait_for``: cancelling the call withdraws
the lookup from the store, so nothing is left waiting there.

Expected output (in some order)::

    rank 0: all 3 ranks ready; gave up waiting for 'never' after 0.5 s
    ...
"""

from __future__ import annotations

import asyncio
import os

import pydvm.aio
from pydvm import Range


async def main() -> None:
    size = int(os.environ["PYDVM_JOB_SIZE"])
    async with await pydvm.aio.Client.connect() as c:
        keys = [f"ready-{r}" for r in range(size)]
        everyone = asyncio.create_task(
            c.lookup(keys, range=Range.NAMESPACE, wait=True, timeout=60))
        await c.publish({f"ready-{c.rank}": True}, range=Range.NAMESPACE)
        found = await everyone
        try:
            await asyncio.wait_for(c.lookup(["never"], wait=True), timeout=0.5)
            outcome = "'never' was published?!"
        except asyncio.TimeoutError:  # the lookup was withdrawn from the store
            outcome = "gave up waiting for 'never' after 0.5 s"
        print(f"rank {c.rank}: all {len(found)} ranks ready; {outcome}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
