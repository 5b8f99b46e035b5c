"""Job programs for atomic updates, key counts and client concurrency
(tests/e2e/test_clients.py).  argv[1] is the mode:

* ``counter N``: every rank adds 1 to the job's counter N times; prints
  ``ADDED v1 v2 ...`` (the values its adds returned).
* ``race``: every rank compare-and-sets ``winner`` from absent to its own
  name; prints ``CAS <value the key holds> <stored>``.
* ``threads``: one thread waits in a lookup of a key nobody publishes yet
  (timeout 30 s) while another makes 200 calls of every kind on the same
  client; prints ``OTHER DONE waiting=<bool>`` (the lookup still waiting
  when the other thread finished), then publishes the key and prints
  ``WAITER GOT <value>``.
* ``unpublish``: the same key published SESSION and LOCAL; prints ``REMOVED
  <n>`` for unpublishing it, again, and for ``unpublish()`` of two more.
* ``noack``: publishes sent without waiting: seen by the next lookup; a
  refused one raised by the next call, by flush() and by close(); prints
  ``SEEN``, ``NEXT <class> <text>``, ``FLUSH <class>``, ``CLOSE <class>``.
* ``keys``: publishes keys under ``p/`` and prints ``KEYS <count> <keys>``
  and ``LIMITED <keys>``.
* ``aio``: the asyncio client's add, compare_and_set, append, keys, count,
  unpublish count and ack=False; prints one line each.
"""

import asyncio
import sys
import threading
import time

from _common import RANK, Client, Persistence, Range, out
from pydvm.errors import PMIxError

mode = sys.argv[1]
NS = Range.NAMESPACE

if mode == "counter":
    n = int(sys.argv[2])
    with Client() as c:
        got = [c.add("ctr", 1, range=NS) for _ in range(n)]
        out("ADDED", *got)

elif mode == "race":
    with Client() as c:
        value, stored = c.compare_and_set("winner", None, f"r{RANK}", range=NS)
        out("CAS", value, stored)

elif mode == "threads":
    with Client() as c:
        result: dict = {}

        def waiter() -> None:
            try:
                result["got"] = c.lookup("release", wait=True, timeout=30)["release"]
            except PMIxError as exc:
                result["got"] = exc.status.pmix_name

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.3)  # the lookup is sent (and parked) before the other calls
        for i in range(50):
            c.publish({f"t{i}": i}, persistence=Persistence.PROC)
            assert c.lookup(f"t{i}")[f"t{i}"] == i
            c.add("tc", 1, range=NS)
            c.count("t")
        out(f"OTHER DONE waiting={t.is_alive() and 'got' not in result}")
        c.publish({"release": "go"})
        t.join(40)
        out("WAITER GOT", result.get("got"))

elif mode == "unpublish":
    with Client() as c:
        c.publish({"u": 1}, persistence=Persistence.SESSION)
        c.publish({"u": 2}, range=Range.LOCAL, persistence=Persistence.SESSION)
        out("REMOVED", c.unpublish("u"))
        out("REMOVED", c.unpublish(["u"]))
        c.publish({"v": 1, "w": 2})
        out("REMOVED", c.unpublish())

elif mode == "noack":
    with Client() as c:
        c.publish({"na": 1}, ack=False)
        out("SEEN" if c.lookup("na")["na"] == 1 else "NOT SEEN")
        c.publish({"na": 2}, ack=False)  # a duplicate: refused
        try:
            c.lookup("na")
            out("NEXT none")
        except PMIxError as exc:
            out("NEXT", type(exc).__name__, "earlier publish" in str(exc))
        out("AFTER", c.lookup("na")["na"])  # raised once only
        c.publish({"na": 3}, ack=False)
        try:
            c.flush()
            out("FLUSH none")
        except PMIxError as exc:
            out("FLUSH", type(exc).__name__)
        c.publish({"na": 4}, ack=False)
    # (the with block's close raises; reached only if it did not)
    out("CLOSE none")

elif mode == "keys":
    with Client() as c:
        c.publish({"p/b": 1, "p/a": 2, "p/": 3, "q": 4}, range=NS)
        c.publish({"p/c": 1}, range=Range.LOCAL)
        out("KEYS", c.count("p/", range=NS), " ".join(c.keys("p/", range=NS)))
        out("LIMITED", " ".join(c.keys("p", range=NS, limit=2)))
        out("LOCAL", c.count("", range=Range.LOCAL))

elif mode == "aio":
    import pydvm.aio

    async def main() -> None:
        c = await pydvm.aio.Client.connect()
        try:
            out("ADD", await c.add("ac", 2, range=NS), await c.add("ac", b"3", range=NS))
            out("CAS", *(await c.compare_and_set("acs", b"", b"x", range=NS)),
                *(await c.compare_and_set("acs", b"y", b"z", range=NS)))
            out("APPEND", await c.append("aa", b"ab", range=NS),
                await c.append("aa", b"cd", range=NS))
            out("KEYS", await c.count("a", range=NS), *(await c.keys("a", range=NS)))
            out("REMOVED", await c.unpublish(["ac", "acs", "nope"]))
            await c.publish({"an": 1}, ack=False)
            await c.publish({"an": 2}, ack=False)
            try:
                await c.flush()
                out("FLUSH none")
            except PMIxError as exc:
                out("FLUSH", type(exc).__name__)
            try:
                await c.add("aa", 1, range=NS)
            except PMIxError as exc:
                out("NOTINT", type(exc).__name__)
        finally:
            await c.close()

    asyncio.run(main())

else:
    sys.exit(f"unknown mode {mode}")
