"""Cancel waiting lookups of the asyncio client, then report what is left.

argv[1]: range word for the lookups (``session`` reaches the master store,
``local`` the node store).  Starts two waiting lookups for keys nobody
publishes, cancels one task after it is parked and lets the other be
abandoned by a timeout of asyncio.wait_for, then prints ``PENDING <n>``
(requests still awaiting a reply on this connection) and holds the
connection open until the file named by argv[2] exists, so the test can
look at the stores while the connection lives.
"""

import asyncio
import os
import sys
import time

import pydvm.aio
from pydvm import Range


async def main() -> None:
    rng = Range.from_word(sys.argv[1])
    async with await pydvm.aio.Client.connect() as c:
        t = asyncio.ensure_future(c.lookup(["never-1"], range=rng, wait=True))
        await asyncio.sleep(0.5)
        t.cancel()
        try:
            await t
        except asyncio.CancelledError:
            pass
        try:
            await asyncio.wait_for(c.lookup(["never-2"], range=rng, wait=True), 0.5)
        except asyncio.TimeoutError:
            pass
        print("PENDING", len(c._ch._pending), flush=True)
        deadline = time.monotonic() + 40
        while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


asyncio.run(main())
