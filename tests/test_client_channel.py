"""The blocking client's channel against a real socket peer."""

from __future__ import annotations

import multiprocessing
import os
import select
import socket

from pydvm.channel import BlockingChannel
from pydvm.protocol import pack

FRAMES = 4096


def _send_all(sock: socket.socket) -> None:
    try:
        sock.sendall(b"".join(pack({"t": "output", "seq": i, "data": b"y\n" * 2048})
                              for i in range(FRAMES)))
    except OSError:
        pass
    os._exit(0)


def test_recv_available_returns_while_the_peer_keeps_sending():
    """A peer that sends without pause (a job's output flooding a ``pydvm
    run``): a call returns with part of it, however fast more comes, so that
    its caller acts on what it has before reading on -- and every message
    still arrives, in order.  It once read for as long as data kept arriving:
    ``pydvm run ... | head -1`` beside busy CPUs waited seconds for its first
    line while the run decoded megabytes of output it could not yet write."""
    a, b = socket.socketpair()
    writer = multiprocessing.get_context("fork").Process(target=_send_all, args=(b,),
                                                        daemon=True)
    writer.start()
    b.close()
    try:
        ch = BlockingChannel(a)
        first: list = []
        eof = False
        while not first and not eof:  # (the first bytes may not make a whole frame)
            select.select([a], [], [], 30)
            first, eof = ch.recv_available()
        seqs = [m["seq"] for m in first]
        while not eof:
            select.select([a], [], [], 30)
            more, eof = ch.recv_available()
            seqs += [m["seq"] for m in more]
    finally:
        writer.kill()
        writer.join(10)
        a.close()
    assert 0 < len(first) < FRAMES // 8, f"one call took {len(first)} of {FRAMES} messages"
    assert seqs == list(range(FRAMES))
