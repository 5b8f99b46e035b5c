"""Bare round trip over a Unix socket pair and over TCP loopback, two processes.

    python bench/store/pingpong.py [ROUNDS]

The floor under a head-node client (Unix socket to the master) and a daemon
node's direct client (TCP to the master): a 60-byte message echoed back by a
forked child, ROUNDS times (default 3,000); prints the median per transport
in µs.  See docs/benchmarks.md (vs_openmpi).
"""

from __future__ import annotations

import os
import socket
import sys
import time


def _echo(s: socket.socket) -> None:
    while True:
        d = s.recv(100)
        if not d:
            return
        s.sendall(d)


def median_us(kind: str, rounds: int) -> float:
    if kind == "unix":
        a, b = socket.socketpair(socket.AF_UNIX)
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
        listener.close()
        for x in (a, b):
            x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pid = os.fork()
    if pid == 0:
        a.close()
        _echo(b)
        os._exit(0)
    b.close()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        a.sendall(b"x" * 60)
        a.recv(100)
        times.append(time.perf_counter() - t)
    a.close()
    os.waitpid(pid, 0)
    times.sort()
    return times[len(times) // 2] * 1e6


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    for kind in ("unix", "tcp"):
        print(f"{kind:<5} {median_us(kind, rounds):7.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
