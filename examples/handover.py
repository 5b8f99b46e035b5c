"""Handover: one job leaves a result that a later job picks up, exactly once.

Run it (from the top of the repository)::

    export PYDVM_URI=$(pydvm start --daemonize)
    pydvm run -n 1 python3 examples/handover.py produce
    pydvm run -n 1 python3 examples/handover.py consume
    pydvm run -n 1 python3 examples/handover.py consume
    pydvm stop

What it shows: data that outlives the job that published it.  The producer
publishes a token with ``Persistence.FIRST_READ``: it stays in the DVM after
the producer's job has ended, and leaves the store with the first lookup
that returns it.  So the first consumer gets it and the second is told there
is nothing (``NotFoundError``).  The two jobs must share a persistent DVM: a
one-shot ``pydvm run`` without ``PYDVM_URI`` takes its DVM, and the token,
down with it.

A consumer started before the producer would wait for the token (up to
``--wait`` seconds) instead of failing: ``consume --wait 30``.  A token
nobody reads goes after ``prte_data_server_timeout`` seconds (300 by
default) of idleness.

Expected output::

    produced job-result = 42 (for the next job)
    consumed job-result = 42, handed over by rank 0 of pydvm-...@1
    nothing to consume: job-result was already taken
"""

from __future__ import annotations

import argparse

from pydvm import Client, Persistence
from pydvm.errors import NotFoundError

KEY = "job-result"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["produce", "consume"])
    ap.add_argument("--wait", type=float, default=0,
                    help="consume: wait up to this many seconds for the token")
    a = ap.parse_args()
    with Client() as c:
        if a.role == "produce":
            c.publish({KEY: 42}, persistence=Persistence.FIRST_READ)
            print(f"produced {KEY} = 42 (for the next job)")
            return 0
        try:
            r = c.lookup([KEY], wait=bool(a.wait), timeout=a.wait or None)
        except NotFoundError:
            print(f"nothing to consume: {KEY} was already taken")
            return 0
        nspace, rank = r.publisher(KEY)
        print(f"consumed {KEY} = {r[KEY]}, handed over by rank {rank} of {nspace}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
