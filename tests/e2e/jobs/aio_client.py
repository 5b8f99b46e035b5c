"""The asyncio client: a waiting lookup and a publish in flight on one connection."""

import asyncio
import os

import pydvm.aio
from pydvm import Persistence, Status
from pydvm.errors import DuplicateKeyError, NotFoundError


async def main() -> None:
    rank = int(os.environ["PYDVM_RANK"])
    async with await pydvm.aio.Client.connect() as c:
        # Start waiting for a key this same connection publishes afterwards.
        waiting = asyncio.ensure_future(c.lookup([f"own-{rank}"], wait=True, timeout=20))
        await asyncio.sleep(0)
        await c.publish({f"own-{rank}": rank * 10}, persistence=Persistence.PROC)
        r = await waiting
        print("WAITED", r[f"own-{rank}"], r.publisher(f"own-{rank}")[1], flush=True)
        try:
            await c.publish({f"own-{rank}": 0}, persistence=Persistence.PROC)
        except DuplicateKeyError as exc:
            print("DUPLICATE", exc.status.pmix_name, flush=True)
        part = await c.lookup([f"own-{rank}", "missing"])
        print("PARTIAL", part.status is Status.ERR_PARTIAL_SUCCESS, sorted(part), flush=True)
        await c.unpublish([f"own-{rank}"])
        try:
            await c.lookup([f"own-{rank}"])
        except NotFoundError:
            print("GONE", flush=True)


asyncio.run(main())
