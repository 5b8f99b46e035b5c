"""Publishes argv[1] items k000, k001, ... sequentially, each value argv[2]
characters long, SESSION persistence (the default session outlives the job)."""

import sys

from _common import Client, Persistence, out

n, size = int(sys.argv[1]), int(sys.argv[2])
with Client() as c:
    for i in range(n):
        c.publish({f"k{i:03d}": "v" * size}, persistence=Persistence.SESSION)
out(f"FLOODED {n}")
