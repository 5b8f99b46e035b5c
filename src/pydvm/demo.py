"""A two-application rendezvous, the job the README's first command runs.

    pydvm run -n 1 python3 -m pydvm.demo server : -n 2 python3 -m pydvm.demo client

App 0 (``server``) opens a TCP port and publishes its address; app 1
(``client``, any number of ranks) waits for that address through the data
store, connects, and exchanges one line with the server.  The address is
published with the default persistence (NSPACE), so it leaves the store when
the job ends.
"""

from __future__ import annotations

import os
import socket
import sys

from .client import Client

KEY = "pydvm-demo-server"


def server() -> int:
    clients = int(os.environ["PYDVM_JOB_SIZE"]) - 1
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    lsock.settimeout(60)
    host, port = lsock.getsockname()
    with Client() as c:
        c.publish({KEY: f"{host}:{port}"})
        print(f"server: published {KEY}={host}:{port}; waiting for {clients} client(s)",
              flush=True)
        for _ in range(clients):
            conn, _ = lsock.accept()
            with conn, conn.makefile("rw") as f:
                hello = f.readline().strip()
                f.write(f"welcome, {hello}\n")
                f.flush()
            print(f"server: greeted {hello}", flush=True)
    return 0


def client() -> int:
    rank = os.environ["PYDVM_RANK"]
    with Client() as c:
        r = c.lookup([KEY], wait=True, timeout=60)
    host, port = r[KEY].rsplit(":", 1)
    ns, srank = r.publisher(KEY)
    with socket.create_connection((host, int(port)), timeout=60) as s, s.makefile("rw") as f:
        f.write(f"rank {rank}\n")
        f.flush()
        answer = f.readline().strip()
    print(f"client {rank}: found the server (rank {srank} of {ns}) at {host}:{port}; "
          f"it said {answer!r}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["server"]:
        return server()
    if argv[1:] == ["client"]:
        return client()
    sys.stderr.write("usage: python -m pydvm.demo server|client (inside a pydvm job)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
