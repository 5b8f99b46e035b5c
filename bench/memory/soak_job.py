"""One job of the soak benchmark (bench/memory/soak.py); argv: INDEX [SESSION_ITEM].

Every job publishes items of each lifetime that ends with it (PROC, APP,
NSPACE, and a LOCAL one in its node store), hands a first-read token to the
next job and consumes the previous job's, publishes an INDEF item every
tenth job, a SESSION item when asked (it runs in a session the driver ends
later), and fails (exit 3) every 97th job after publishing.
"""

import sys

from pydvm import Client, Persistence, Range
from pydvm.errors import NotFoundError

i = int(sys.argv[1])
in_session = len(sys.argv) > 2
with Client() as c:
    c.publish({f"p-{i}": "x" * 32}, persistence=Persistence.PROC)
    c.publish({f"a-{i}": i}, persistence=Persistence.APP)
    c.publish({f"n-{i}": b"\x00" * 64})
    c.publish({f"l-{i}": 1.5}, range=Range.LOCAL)
    c.publish({f"tok-{i}": f"token {i}"}, persistence=Persistence.FIRST_READ)
    if i:
        try:
            c.lookup([f"tok-{i - 1}"], wait=True, timeout=10)
        except NotFoundError:
            sys.exit(4)
    if i % 10 == 0:
        c.publish({f"indef-{i}": True}, persistence=Persistence.INDEF)
    if in_session:
        c.publish({f"s-{i}": "session"}, persistence=Persistence.SESSION)
if i % 97 == 0:
    sys.exit(3)
