"""Rank 1 publishes its own items; rank 0 then publishes items of several
persistences and calls unpublish() with no keys."""

from _common import RANK, Client, Persistence, Range, out

with Client() as c:
    if RANK == 1:
        c.publish({"other_loc": "o"}, range=Range.LOCAL, persistence=Persistence.INDEF)
        c.publish({"other": "o"}, persistence=Persistence.INDEF)
        out("RANK1 PUBLISHED")
    else:
        c.lookup(["other"], wait=True, timeout=30)  # rank 1's items exist before we unpublish
        c.publish({"u_indef": "1"}, persistence=Persistence.INDEF)
        c.publish({"u_sess": "1"}, persistence=Persistence.SESSION)
        c.publish({"u_fr": "1"}, persistence=Persistence.FIRST_READ)
        c.publish({"u_loc": "1"}, range=Range.LOCAL, persistence=Persistence.INDEF)
        c.unpublish()
        out("RANK0 UNPUBLISHED")
