"""Two ranks: rank 0's PROC item must go when rank 0 exits, while rank 1 runs.

argv[1] is the range word used for every request (``session`` goes to the
master store, ``local`` to the daemon store of the node both ranks share).
"""

import sys

from _common import RANK, Client, Persistence, Range, out, present, wait_gone

rng = Range.from_word(sys.argv[1])
with Client() as c:
    if RANK == 0:
        c.publish({"p0": "x"}, range=rng, persistence=Persistence.PROC)
        c.lookup(["ack"], range=rng, wait=True, timeout=30)
        out("RANK0 EXIT")
    else:
        c.publish({"p1": "y"}, range=rng, persistence=Persistence.PROC)
        c.lookup(["p0"], range=rng, wait=True, timeout=30)
        out("RANK1 SAW p0")
        c.publish({"ack": "1"}, range=rng, persistence=Persistence.PROC)
        out("P0 GONE" if wait_gone(c, "p0", rng) else "P0 STILL THERE")
        out("P1 FOUND" if present(c, "p1", rng) else "P1 NOT_FOUND")
