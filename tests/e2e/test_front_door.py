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


# ---------------------------------------------------------------------------
# descriptors
# ---------------------------------------------------------------------------

#: The DVM's descriptor limit (soft = hard) in the storm test.
LOW_LIMIT = 256
#: Connections the storm keeps open (more than the DVM's limit).
STORM = 400


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_LIMIT, LOW_LIMIT))


class Storm(threading.Thread):
    """Keeps ``STORM`` idle connections open to the master, opening a new
    one for each the master closes, as fast as it can, until stopped."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.addr = (host, port)
        self.stop = threading.Event()
        self.opened = 0
        self.socks: list[socket.socket] = []

    def run(self) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        while not self.stop.is_set():
            while len(self.socks) < STORM and not self.stop.is_set():
                try:
                    s = socket.create_connection(self.addr, timeout=IO_TIMEOUT)
                except OSError:
                    break
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
                self.socks.append(s)
                self.opened += 1
            for key, _ in sel.select(0.05):  # the challenge, or a close
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(s)
                    s.close()
                    self.socks.remove(s)
        for s in self.socks:
            sel.unregister(s)
            s.close()
        self.socks.clear()


def test_descriptor_storm_keeps_tools_served(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < STORM + 200:  # the storm's own descriptors, in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    from dvmkit import start_dvm

    dvm = start_dvm(tmp_path, hosts="a", preexec=_low_nofile)
    try:
        uri = master_uri(dvm)
        storm = Storm(uri.host, uri.port)
        storm.start()
        try:
            wait_for(lambda: storm.opened >= STORM, timeout=CMD_TIMEOUT,
                     what=f"{STORM} connections opened")
            for i in range(3):  # tools and jobs are served meanwhile
                p = dvm.run("-n", "1", "echo", f"served{i}")
                assert p.returncode == 0 and f"served{i}" in p.stdout, p.stdout + p.stderr
            during = info(dvm).get("descriptors")
            assert during is not None, "pydvm info shows no descriptors"
            assert during["limit"] == LOW_LIMIT and during["hard"] == LOW_LIMIT, during
            assert during["open"] <= LOW_LIMIT - during["reserve"] // 2, during
            assert during["closed_at_limit"] > 0, during
        finally:
            storm.stop.set()
            storm.join(CMD_TIMEOUT)
        ended = time.monotonic()
        peer, _ = master_peer_authenticated(dvm)
        back = time.monotonic() - ended
        peer.close()
        print(f"storm of {storm.opened} connections; a tool served {back:.3f}s after it ended; "
              f"during it: {during}")
        assert back < 1.0, back
        wait_for(lambda: log_lines(dvm, "master", r"descriptor limit episode over"),
                 timeout=10, what="the end of the episode in the log")
        started = log_lines(dvm, "master", r"descriptor limit reached")
        assert len(started) == 1, started  # once per episode, not per connection
        assert "of 256 descriptors open" in started[0], started
    finally:
        dvm.stop()


def master_peer_authenticated(dvm):
    """A raw tool connection to the master, and its answer to ``info``."""
    from rawpeers import tool

    peer = tool(dvm)
    return peer, peer.call({"t": "ping"})
