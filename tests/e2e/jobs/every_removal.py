"""Publishes one item for each removal rule, then exits (the metrics test).

Master store: ``p1`` PROC, ``a1`` APP, ``n1``+``n2`` NSPACE (one item),
``s1`` SESSION, ``f1`` FIRST_READ read at once (consumed), ``u1``+``u2``
INDEF with ``u1`` unpublished, ``r1`` INDEF replaced by a second ``r1``.
Node store: ``l1`` LOCAL PROC.  What is left to go later: ``u2`` and the new
``r1`` (idle timeout), ``s1`` (its session's end), the rest with this job.
"""

from _common import Client, Persistence, Range, out

with Client() as c:
    c.publish({"p1": 1}, persistence=Persistence.PROC)
    c.publish({"a1": 1}, persistence=Persistence.APP)
    c.publish({"n1": 1, "n2": 2}, persistence=Persistence.NSPACE)
    c.publish({"s1": 1}, persistence=Persistence.SESSION)
    c.publish({"f1": 1}, persistence=Persistence.FIRST_READ)
    c.lookup(["f1"])
    c.publish({"u1": 1, "u2": 2}, persistence=Persistence.INDEF)
    c.unpublish(["u1"])
    c.publish({"r1": 1}, persistence=Persistence.INDEF)
    c.publish({"r1": 2}, persistence=Persistence.INDEF, replace=True)
    c.publish({"l1": 1}, range=Range.LOCAL, persistence=Persistence.PROC)
out("PUBLISHED ALL")
