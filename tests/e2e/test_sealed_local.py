"""Sealed links on one machine: ``pydvm_seal all`` seals loopback links too.

The attacker's tests (tests/multinode/test_sealed_links.py) need network
namespaces; these run every sealed path a DVM of local daemons has --
daemons, tools, ``pydvm run``, the job API -- and speak the sealed
handshake by hand as a peer would, to check the master's side of each
refusal.
"""

from __future__ import annotations

import re
import socket

import pytest

from dvmkit import wait_for
from rawpeers import log_lines

from pydvm.protocol import HANDSHAKE_FRAME, DvmUri, FrameDecoder, mac, pack, packb
from pydvm.seal import TAG, Answer


def one_line(dvm, name: str, pattern: str) -> str:
    """The one line of ``name``'s log matching ``pattern`` (waited for)."""
    wait_for(lambda: log_lines(dvm, name, pattern), timeout=10, what=f"{pattern!r} logged")
    lines = log_lines(dvm, name, pattern)
    assert len(lines) == 1, lines
    return lines[0]


class SealedPeer:
    """A raw TCP connection to a master, through the sealed handshake when
    the master offers it; ``psk`` (default: the secret) seals it."""

    def __init__(self, dvm, role: str = "tool", secret: bytes | None = None,
                 psk: bytes | None = None, clear: bool = False) -> None:
        self.uri = DvmUri.parse(dvm.uri)
        self.secret = dvm.secret() if secret is None else secret
        self.sock = socket.create_connection((self.uri.host, self.uri.port), timeout=10)
        self.local = "%s:%d" % self.sock.getsockname()
        self.dec = FrameDecoder(handshake=HANDSHAKE_FRAME)
        self.box = None
        self.challenge = self.recv()
        self.dec.handshake = None
        if clear:
            return
        hello = Answer(self.challenge, dvm=self.uri.dvmid, role=role, secret=None)
        if hello.sealed:
            self.sock.sendall(pack(hello.message))
            self.box = hello.box(psk if psk is not None else self.secret)
            self.dec.open_with(self.box.opener.open, TAG)

    def send(self, msg: dict) -> None:
        if self.box is None:
            self.sock.sendall(pack(msg))
        else:
            self.sock.sendall(self.box.sealer.frame(packb(msg)))

    def recv(self) -> dict | None:
        """The next message; None at the end of the stream."""
        while True:
            got = self.dec.feed(b"")
            if got:
                return got[0]
            data = self.sock.recv(65536)
            if not data:
                return None
            got = self.dec.feed(data)
            if got:
                return got[0]

    def auth(self, role: str = "tool", **fields) -> dict | None:
        self.send({"t": "auth", "id": 1, "role": role,
                   "mac": mac(self.secret, self.challenge["nonce"], role), **fields})
        return self.recv()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sealed(make_dvm):
    return make_dvm(hosts="a,b", pydvm_seal="all")


def test_with_seal_all_the_daemons_tools_and_jobs_of_a_local_dvm_are_sealed(sealed, monkeypatch):
    p = sealed.cmd("info", check=True)
    m = re.search(r"links: (\d+) sealed, (\d+) clear over TCP \(pydvm_seal all\)", p.stdout)
    assert m and int(m.group(1)) == 3 and m.group(2) == "0", p.stdout  # 2 daemons + info
    p = sealed.run("-n", "2", "sh", "-c", "echo rank $PYDVM_RANK on $PYDVM_NODE")
    assert p.returncode == 0 and sorted(p.stdout.split("\n")[:2]) == [
        "rank 0 on a", "rank 1 on b"], p.stdout + p.stderr
    import pydvm.jobs
    monkeypatch.setenv("PYDVM_STATE_DIR", sealed.env["PYDVM_STATE_DIR"])
    with pydvm.jobs.connect(sealed.uri) as api:
        r = api.submit("echo via-api", stdout="capture").result(timeout=60)
        assert r.ok and b"via-api" in r.stdout


def test_a_raw_sealed_tool_is_served_and_a_flipped_frame_closes_only_it(sealed):
    peer = SealedPeer(sealed)
    try:
        assert peer.box is not None and peer.challenge["seal"] is True
        assert peer.auth()["status"] == 0
        peer.send({"t": "ps", "id": 2})
        assert peer.recv()["status"] == 0
        frame = bytearray(peer.box.sealer.frame(packb({"t": "ps", "id": 3})))
        frame[-5] ^= 0x10
        peer.sock.sendall(bytes(frame))
        assert peer.recv() is None  # closed, and nothing answered
    finally:
        peer.close()
    one_line(sealed, "master", re.escape("tool#") + r"\d+: " + re.escape(
        f"closed: sealed link broken from {peer.local}: sealed frame #2 does not open"))
    assert sealed.cmd("ps").returncode == 0


def test_a_clear_auth_where_a_seal_is_required_is_refused(sealed):
    peer = SealedPeer(sealed, clear=True)
    try:
        r = peer.auth()
        assert r["status"] != 0 and "must be sealed" in r["msg"], r
        assert peer.recv() is None
    finally:
        peer.close()
    one_line(sealed, "master", "handshake refused: this link must be sealed")


def test_a_sealed_auth_without_the_secret_is_refused(sealed):
    peer = SealedPeer(sealed, psk=bytes(32))
    try:
        assert peer.auth(role="daemon", node="intruder") is None
    finally:
        peer.close()
    one_line(sealed, "master", "sealed frame #0 does not open .*lacks the key")
    p = sealed.cmd("info", check=True)
    assert "intruder" not in p.stdout


def test_loopback_links_stay_clear_by_default_and_refuse_a_seal(make_dvm):
    dvm = make_dvm(hosts="a")
    peer = SealedPeer(dvm, clear=True)
    try:
        assert peer.challenge["seal"] is False and "kx" not in peer.challenge
        peer.send({"t": "seal", "v": 1, "role": "tool", "nonce": bytes(32), "kx": bytes(32)})
        r = peer.recv()
        assert r["status"] != 0 and "no seal message expected" in r["msg"], r
    finally:
        peer.close()
    p = dvm.cmd("info", check=True)
    assert re.search(r"links: 0 sealed, \d+ clear over TCP \(pydvm_seal network\)", p.stdout)
