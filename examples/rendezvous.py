"""Rendezvous: every rank of a job finds every other rank's address, then they talk.

Run it (from the top of the repository)::

    pydvm run -n 4 python3 examples/rendezvous.py

What it shows: the wire-up at the start of a parallel program.  Each rank
opens a TCP port of its own and publishes its address under ``addr-<rank>``
with ``Range.NAMESPACE`` (only processes of this job see it).  Then it waits
-- one lookup with ``wait=True`` -- until all ranks have published, connects
to its right-hand neighbour in a ring, sends a greeting and reads the one
from its left-hand neighbour.  No rank needs to know when the others start:
the waiting lookup is parked in the store until the last address arrives.

The addresses use the default persistence (``NSPACE``): they leave the store
when the job ends, so the next job's ranks can publish the same keys.

Expected output (in some order)::

    rank 0 heard from rank 3: hello from rank 3
    rank 1 heard from rank 0: hello from rank 0
    ...
"""

from __future__ import annotations

import os
import socket

from pydvm import Client, Range


def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    host, port = listener.getsockname()[:2]
    with Client() as c:
        size = int(os.environ["PYDVM_JOB_SIZE"])  # ranks in this job
        c.publish({f"addr-{c.rank}": f"{host}:{port}"}, range=Range.NAMESPACE)
        everyone = c.lookup([f"addr-{r}" for r in range(size)], range=Range.NAMESPACE,
                            wait=True, timeout=60)
        right = (c.rank + 1) % size
        rhost, rport = everyone[f"addr-{right}"].rsplit(":", 1)
        with socket.create_connection((rhost, int(rport)), timeout=60) as out:
            out.sendall(f"hello from rank {c.rank}\n".encode())
            conn, _ = listener.accept()
            with conn, conn.makefile() as f:
                greeting = f.readline().strip()
        left = (c.rank - 1) % size
        print(f"rank {c.rank} heard from rank {left}: {greeting}", flush=True)


if __name__ == "__main__":
    main()
