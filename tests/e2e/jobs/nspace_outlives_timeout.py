"""Publishes an NSPACE item, then an INDEF canary, prints READY, waits for the
test's go file (argv[1]) and then reports whether the NSPACE item is still found."""

import sys

from _common import Client, Persistence, out, present, wait_file

with Client() as c:
    c.publish({"nskey": "n"})  # default persistence: NSPACE
    c.publish({"canary": "c"}, persistence=Persistence.INDEF)
    out("READY")
    if not wait_file(sys.argv[1]):
        out("NO GO FILE")
    out("NSKEY FOUND" if present(c, "nskey") else "NSKEY NOT_FOUND")
