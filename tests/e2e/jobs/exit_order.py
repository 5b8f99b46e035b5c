"""argv: FIRST_RANK FIRST_CODE LATER_CODE.  The first rank exits with
FIRST_CODE; the other rank waits until that exit has been accounted by the
master (the first rank's PROC item reads NOT_FOUND), then exits LATER_CODE."""

import sys

from _common import RANK, Client, Persistence, out, wait_gone

first, first_code, later_code = (int(a) for a in sys.argv[1:4])
with Client() as c:
    if RANK == first:
        c.publish({"marker": "m"}, persistence=Persistence.PROC)
        c.lookup(["ready"], wait=True, timeout=30)
        code = first_code
    else:
        c.lookup(["marker"], wait=True, timeout=30)
        c.publish({"ready": "1"}, persistence=Persistence.PROC)
        out("FIRST ACCOUNTED" if wait_gone(c, "marker") else "FIRST NOT ACCOUNTED")
        code = later_code
sys.exit(code)
