"""Raw peers for the bad-input tests: framed sockets, logs, and a held client.

Shared by test_bad_input.py, test_hardening.py and test_fuzz.py: a
:class:`Peer` speaks (or mangles) the wire on a raw socket with bounded
reads; :class:`LogCheck` and :func:`assert_no_crash` read what the DVM
logged; :class:`HeldJob` (fixture ``held`` in conftest.py) is a job holding an
ordinary client connection open while a test misbehaves on the same daemon.
"""

from __future__ import annotations

import itertools
import os
import queue
import re
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dvmkit import pid_alive

from pydvm.runtime.shared.auth import DvmUri, mac
from pydvm.wire import HEADER, MAX_FRAME, FrameDecoder, pack

BAD_PARAM = -27
NO_PERMISSIONS = -23
#: Bound on any single socket read or expected closure.
IO_TIMEOUT = 5.0
#: Bound on waiting for expected log lines.  They are written in the event-loop
#: step of the close they explain, so this is generous.
WAIT_TIMEOUT = 2.0
#: Bound on waiting for a store counter (each poll is a ``pydvm store`` run).
STORE_TIMEOUT = 5.0


# ---------------------------------------------------------------------------
# raw connections
# ---------------------------------------------------------------------------


class Peer:
    """One raw connection to a pydvm socket; every read is bounded."""

    _ids = itertools.count(1000)

    def __init__(self, sock: socket.socket, what: str) -> None:
        self.sock = sock
        self.what = what
        sock.settimeout(IO_TIMEOUT)
        self._dec = FrameDecoder()
        self._queue: list[dict] = []
        self.eof = False

    @classmethod
    def unix(cls, path: str) -> "Peer":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(IO_TIMEOUT)
        s.connect(path)
        return cls(s, f"unix:{path}")

    @classmethod
    def tcp(cls, host: str, port: int) -> "Peer":
        s = socket.create_connection((host, port), timeout=IO_TIMEOUT)
        return cls(s, f"tcp:{host}:{port}")

    # -- sending ---------------------------------------------------------

    def send(self, msg: dict) -> None:
        self.sock.sendall(pack(msg))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    # -- receiving -------------------------------------------------------

    def _read(self, deadline: float) -> bool:
        """Read once into the queue; False at EOF (or reset).  Fails at the deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{self.what}: nothing within {IO_TIMEOUT}s "
                                 "(neither an answer nor a closed connection)")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except socket.timeout:
            raise AssertionError(f"{self.what}: nothing within {IO_TIMEOUT}s "
                                 "(neither an answer nor a closed connection)") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self._queue.extend(self._dec.feed(data))
        return True

    def recv(self, timeout: float = IO_TIMEOUT) -> dict:
        """The next message other than a heartbeat ping; fails on EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            while not self._queue:
                if self.eof or not self._read(deadline):
                    raise AssertionError(f"{self.what}: connection closed while a message was due")
            msg = self._queue.pop(0)
            if msg.get("t") != "ping":
                return msg

    def call(self, msg: dict, timeout: float = IO_TIMEOUT) -> dict:
        """Send a request (with a fresh id unless it has one); return the reply to it."""
        msg = dict(msg)
        msg.setdefault("id", next(self._ids))
        self.send(msg)
        r = self.recv(timeout)
        assert r.get("t") == "reply", r
        assert r.get("id") == msg["id"], (msg, r)
        return r

    def expect_closed(self, timeout: float = IO_TIMEOUT) -> list[dict]:
        """Read until the other side closes; return what it sent first.  Fails if it stays open."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            self._read(deadline)
        out, self._queue = [m for m in self._queue if m.get("t") != "ping"], []
        return out

    # -- ending ----------------------------------------------------------

    @property
    def log_name(self) -> str:
        """How the master names this connection in its log before the handshake (a regex)."""
        return re.escape(f"peer {self.sock.getsockname()}")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def half_close(self) -> None:
        """Shut our sending side: the peer sees EOF, we can still read."""
        self.sock.shutdown(socket.SHUT_WR)


def frame_of_body(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def truncated_frame() -> bytes:
    """The start of a frame announcing 100 bytes, with only 10 of them."""
    return HEADER.pack(100) + b"\x8a" + b"\x00" * 9


def oversized_header() -> bytes:
    return HEADER.pack(MAX_FRAME + 1)


def assert_only_error_frames(msgs: list[dict], *, limit_named: int = 0) -> None:
    """What a peer gets before a protocol-error close: at most "error" frames
    (BAD_PARAM), naming the frame limit ``limit_named`` if given (MAX_FRAME;
    HANDSHAKE_FRAME before a handshake)."""
    for m in msgs:
        assert m.get("t") == "error", m
        assert m.get("status") == BAD_PARAM, m
        assert m.get("msg"), m
        if limit_named:
            assert str(limit_named) in m["msg"], m


# ---------------------------------------------------------------------------
# logs
# ---------------------------------------------------------------------------


def log_lines(dvm, name: str, pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [ln for ln in dvm.log(name).splitlines() if rx.search(ln)]


class LogCheck:
    """A test's expected log lines, checked together at the end of the test.

    Checked after the rest of the rule (others still served), so a missing
    log line does not hide whether the rest held, and one short deadline
    covers them all: each line is written in the event-loop step of the close
    it explains, long before the end of the test.
    """

    def __init__(self, dvm) -> None:
        self.dvm = dvm
        self.wanted: list[tuple[str, str, int, str]] = []

    def expect(self, name: str, pattern: str, count: int = 1, label: str = "") -> None:
        self.wanted.append((name, pattern, count, label))

    def _missing(self) -> list[str]:
        out = []
        for name, pattern, count, label in self.wanted:
            got = len(log_lines(self.dvm, name, pattern))
            if got < count:
                out.append(f"{label + ': ' if label else ''}{name}.log has {got} line(s) "
                           f"matching {pattern!r}, expected {count}")
        return out

    def check(self) -> None:
        deadline = time.monotonic() + WAIT_TIMEOUT
        while (missing := self._missing()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if missing:
            logs = "\n".join(f"--- {n}.log ---\n{self.dvm.log(n) or '(empty)'}"
                             for n in sorted({w[0] for w in self.wanted}))
            raise AssertionError("missing log lines:\n" + "\n".join(missing) + "\n" + logs)


CRASH_PATTERNS = r"Traceback|handler failed|internal task failed|lost node|lost the master"


def assert_no_crash(dvm) -> None:
    """No log shows a handler exception, a failed task or a lost node."""
    for name in ("master", "a", "b", "c"):
        bad = log_lines(dvm, name, CRASH_PATTERNS)
        assert not bad, f"{name}.log:\n{dvm.log(name)}"
    for name, pid in dvm.daemon_pids.items():
        assert pid_alive(pid), f"daemon {name} died"
    assert pid_alive(dvm.pid), "the master died"


# ---------------------------------------------------------------------------
# the job that holds a client connection
# ---------------------------------------------------------------------------


@dataclass
class HeldJob:
    """``pydvm run`` of jobs/hold_client.py, with its stdout read by a thread."""

    proc: subprocess.Popen
    go: Path
    server: str = ""
    nspace: str = ""
    rank: int = 0
    node: str = ""

    def __post_init__(self) -> None:
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for ln in self.proc.stdout:
            self._lines.put(ln.rstrip("\n"))
        self._lines.put(None)

    def line(self, prefix: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                ln = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line from the held job in {timeout}s") from None
            if ln is None:
                raise AssertionError(f"held job ended before printing {prefix!r} "
                                     f"(exit {self.proc.poll()}): {self.proc.stderr.read()}")
            if ln.startswith(prefix):
                return ln

    def hello(self) -> dict:
        return {"t": "hello", "nspace": self.nspace, "rank": self.rank}

    def release_and_check(self) -> None:
        """The held job is still running; told to go on, it is served on its old connection."""
        assert self.proc.poll() is None, "the held job ended early"
        self.go.touch()
        assert self.line("HELD") == "HELD still-served"
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the held job did not end after being released") from None
        assert rc == 0, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


_keys = itertools.count()


def assert_others_still_served(dvm, held: HeldJob) -> None:
    """Tools work, a new job publishes and looks up through the same daemon, the held job is served."""
    stores = dvm.store()
    assert set(stores) == {"master", "a", "b", "c"}
    for s in stores.values():
        assert "error" not in s, s
    key = f"after{next(_keys)}"
    p = dvm.run("--host", held.node, "-n", "1", "sh", "-c",
                f"pydvm publish {key}=fine && pydvm lookup {key}", timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"FOUND {key} fine from " in p.stdout, p.stdout
    held.release_and_check()
    assert_no_crash(dvm)


#: How our raw connections are named in the logs (regexes).  The daemon names a
#: client connection "client" before hello and "client NS:RANK pid PID" after
#: it; the master names a connection "peer (HOST, PORT)" before the handshake
#: (:attr:`Peer.log_name`) and "tool#N" once it is a tool.
BEFORE_HELLO = r"\bclient: "
TOOL = r"\btool#\d+: "


def greeted_name(held: HeldJob) -> str:
    """The daemon's name for our connection once it said hello as the held job."""
    return re.escape(f"client {held.nspace}:{held.rank} pid {os.getpid()}: ")


def client(held: HeldJob) -> Peer:
    """A raw connection to the held job's daemon, greeted with a valid hello."""
    peer = Peer.unix(held.server)
    r = peer.call(held.hello())
    assert r["status"] == 0, r
    assert r.get("node") == held.node
    return peer


def master_uri(dvm) -> DvmUri:
    return DvmUri.parse(dvm.uri)


def master_peer(dvm) -> tuple[Peer, dict]:
    """A raw TCP connection to the master and the challenge it opened with."""
    uri = master_uri(dvm)
    peer = Peer.tcp(uri.host, uri.port)
    challenge = peer.recv()
    assert challenge["t"] == "challenge", challenge
    assert challenge["dvm"] == uri.dvmid
    assert isinstance(challenge["nonce"], bytes) and len(challenge["nonce"]) == 32
    return peer, challenge


def tool(dvm) -> Peer:
    """A raw TCP connection to the master, authenticated as a tool."""
    secret = dvm.secret()
    peer, challenge = master_peer(dvm)
    r = peer.call({"t": "auth", "role": "tool", "mac": mac(secret, challenge["nonce"], "tool")})
    assert r["status"] == 0, r
    return peer


def daemon_sockets(dvm) -> dict[str, str]:
    """Every daemon's client socket: /tmp/pydvm-UID/DVMID-NODE-*/client.sock."""
    base = Path(tempfile.gettempdir()) / f"pydvm-{os.getuid()}"
    dvmid = master_uri(dvm).dvmid
    return {p.parent.name[len(dvmid) + 1:].rsplit("-", 1)[0]: str(p)
            for p in base.glob(f"{dvmid}-*/client.sock")}


def parked(dvm, store: str) -> int:
    return dvm.store()[store]["parked"]
