"""The front door: what a peer that has not authenticated can make a DVM hold.

Real DVMs, raw sockets.  A stranger's frame is read only up to the
handshake cap (4 KiB): a bigger one closes its connection with one log
line, so the master's memory stays where it was however much strangers
send; a normal ``pydvm run`` works meanwhile.  The same holds on the
node's client socket and the master's direct-data socket.  With the
descriptor limit low (256), a storm of idle strangers cannot keep tools
out: the oldest strangers are closed, the episode is logged, ``pydvm info``
shows the limit and the use.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

from dvmkit import CMD_TIMEOUT, PYDVM, wait_for
from rawpeers import IO_TIMEOUT, Peer, daemon_sockets, log_lines, master_uri
from pydvm import protocol
from pydvm.wire import HEADER

pytestmark = pytest.mark.e2e

MiB = 1 << 20
#: Strangers sending at once, and what each sends of the frame it announces.
STRANGERS = 6
SENT = 16 * MiB
ANNOUNCED = 48 * MiB
#: The cap on a frame before the handshake (4 KiB).
HANDSHAKE_FRAME = getattr(protocol, "HANDSHAKE_FRAME", 4096)
#: How much the master's RSS may grow while they do (it was SENT per stranger).
RSS_SLACK = 12 * MiB


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def info(dvm) -> dict:
    code = ("import asyncio, json;"
            "from pydvm.cli.tool import call, resolve_uri;"
            "print(json.dumps(asyncio.run(call(resolve_uri(None), {'t': 'info'}))))")
    e = dict(dvm.env, PYDVM_URI=dvm.uri)
    p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=CMD_TIMEOUT, check=True)
    return json.loads(p.stdout)


class Stranger(threading.Thread):
    """Connects to the master's TCP port and sends a huge frame's header and
    ``SENT`` bytes of it, then holds the connection until released."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=IO_TIMEOUT)
        self.sent = 0
        self.closed_by_peer = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        chunk = b"\x00" * MiB
        try:
            self.sock.sendall(HEADER.pack(ANNOUNCED))
            while self.sent < SENT:
                self.sock.sendall(chunk)
                self.sent += len(chunk)
        except OSError:  # closed on us: what should happen
            self.closed_by_peer.set()
        self.release.wait(CMD_TIMEOUT)
        self.sock.close()


def test_strangers_huge_frames_do_not_grow_the_master(make_dvm):
    dvm = make_dvm("a")
    assert dvm.run("-n", "1", "true").returncode == 0  # warm: the first job's allocations
    before = rss(dvm.pid)
    uri = master_uri(dvm)
    strangers = [Stranger(uri.host, uri.port) for _ in range(STRANGERS)]
    for s in strangers:
        s.start()
    try:
        p = dvm.run("-n", "1", "echo", "served")  # a normal run works meanwhile
        assert p.returncode == 0 and "served" in p.stdout, p.stdout + p.stderr
        for s in strangers:
            assert s.closed_by_peer.wait(IO_TIMEOUT), \
                f"the master read {s.sent} bytes of a stranger's {ANNOUNCED}-byte frame"
        after = rss(dvm.pid)
    finally:
        for s in strangers:
            s.release.set()
    print(f"master RSS {before / MiB:.1f} MiB before, {after / MiB:.1f} MiB after "
          f"{STRANGERS} strangers each sent {SENT // MiB} MiB")
    assert after - before < RSS_SLACK, (before, after)
    def closures() -> int:
        return len(log_lines(dvm, "master", rf"before the handshake exceeds the limit of "
                                            rf"{HANDSHAKE_FRAME}"))
    wait_for(lambda: closures() >= STRANGERS, timeout=5, what="one log line per stranger")
    assert closures() == STRANGERS  # one line each, not one per chunk


def _direct_socket(dvm) -> str:
    return info(dvm)["direct_unix"]["path"]


@pytest.mark.parametrize("where", ["node client socket", "master direct-data socket"])
def test_unix_sockets_close_a_stranger_over_the_cap(make_dvm, where):
    dvm = make_dvm("a")
    path = daemon_sockets(dvm)["a"] if where == "node client socket" else _direct_socket(dvm)
    peer = Peer.unix(path)
    try:
        try:
            peer.send_raw(HEADER.pack(32 * MiB) + b"\x00" * (HANDSHAKE_FRAME * 2))
        except OSError:
            pass  # already closed on us
        peer.expect_closed()  # not left open, waiting for the rest of 32 MiB
    finally:
        peer.close()
    log = "a" if where == "node client socket" else "master"
    wait_for(lambda: log_lines(dvm, log, r"before the handshake exceeds the limit"),
             timeout=5, what=f"the closure in {log}.log")
    assert dvm.run("-n", "1", "true").returncode == 0
