"""MPMD: app 0 publishes an APP item and an NSPACE item; app 1 watches them.

argv[1], if given, is the range word of the two items and of app 1's
lookups (``local``: both apps must then run on the same node).

app 0 stays until app 1 has seen both items (so app 1's later NOT_FOUND
means the item went, not that it was never seen), then exits; app 1 polls
the APP item until it is gone and then checks the NSPACE item is still there.
"""

import sys

from _common import APP_IDX, Client, Persistence, Range, out, present, wait_gone

rng = Range.from_word(sys.argv[1]) if len(sys.argv) > 1 else Range.SESSION

with Client() as c:
    if APP_IDX == 0:
        c.publish({"app_item": "a0"}, persistence=Persistence.APP, range=rng)
        c.publish({"ns_item": "n0"}, range=rng)  # default persistence: NSPACE
        c.lookup(["app1_saw"], wait=True, timeout=30)
        out("APP0 EXIT")
    else:
        r = c.lookup(["app_item", "ns_item"], wait=True, timeout=30, range=rng)
        ns, rank = r.publisher("app_item")
        out(f"APP1 SAW app_item={r['app_item']} ns_item={r['ns_item']} from {ns}:{rank}")
        c.publish({"app1_saw": "1"}, persistence=Persistence.PROC)
        out("APP_ITEM GONE" if wait_gone(c, "app_item", rng) else "APP_ITEM STILL THERE")
        out("NS_ITEM FOUND" if present(c, "ns_item", rng) else "NS_ITEM NOT_FOUND")
