"""An attacker on the network path between a test host and the master.

Three network namespaces and the root one::

    master (root namespace) 10.253.1.1 ── bridge pseal-br ── seal-b  10.253.1.12
                                              │
                                          seal-x 10.253.1.9   (the attacker)
                                              │ (its own link)
                                          seal-a 10.253.2.11  (the victim host)

``seal-a``'s only way out is through ``seal-x``.  There, policy routing
(``ip rule iif eth1 lookup 100`` with ``local 0.0.0.0/0`` in table 100)
delivers whatever ``seal-a`` sends to a local socket, whatever its
destination: a listening socket with ``IP_TRANSPARENT`` on the master's
port accepts ``seal-a``'s connections to the master as if it were the
master, and :class:`Mitm` -- a thread of the test process living in
``seal-x`` -- opens its own connection to the real master for each one and
relays the bytes.  Neither end is told: the DVM is configured as it would
be anywhere (its URI names the master's own address), and every link of
``seal-a`` -- its daemon, its tools, its jobs' direct data -- crosses the
attacker.  This kernel has no iptables; policy routing is all it needs.

The relay records every byte both ways and reads each direction as frames
(``u32 length | body``: clear and sealed frames alike), so a test can act
on the Nth frame of a connection, picked by the role its peer announced in
clear (``daemon``, ``tool``, ``client``) and the frame's size: flip a bit,
drop it, replay it, put other bytes before it, or cut the stream inside
it.  It can also speak for the master itself (:meth:`Mitm.impersonate`)
or rewrite the master's challenge (a downgrade).

Needs root and iproute2 (:func:`hostnet.unavailable_reason`).  Fixed
names: one user per machine at a time (a lock file, as HostNet's).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import msgpack

from hostnet import IP, Topology

BRIDGE = "pseal-br"
ATTACKER, VICTIM, PLAIN = "seal-x", "seal-a", "seal-b"
MASTER_ADDR = "10.253.1.1"
ATTACKER_ADDR = "10.253.1.9"
PLAIN_ADDR = "10.253.1.12"
VICTIM_GW, VICTIM_ADDR = "10.253.2.1", "10.253.2.11"

CLONE_NEWNET = 0x40000000
IP_TRANSPARENT = 19
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def _in(ns: str, *args: str) -> None:
    _ip("netns", "exec", ns, IP, *args)


class AttackNet(Topology):
    """The topology above; a context manager that always removes it."""

    names = (VICTIM, PLAIN)
    master_addr = MASTER_ADDR

    def __init__(self) -> None:
        self._lock: int | None = None

    def lock_name(self) -> str:
        return "pydvm-attacknet"

    def up(self) -> None:
        self.down()  # leftovers of a crashed earlier run
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{MASTER_ADDR}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for ns in (ATTACKER, VICTIM, PLAIN):
            _ip("netns", "add", ns)
            _in(ns, "link", "set", "lo", "up")
        for ns, addr, tag in ((ATTACKER, ATTACKER_ADDR, "x"), (PLAIN, PLAIN_ADDR, "b")):
            _ip("link", "add", f"pseal-v{tag}", "type", "veth", "peer", "name", f"pseal-p{tag}")
            _ip("link", "set", f"pseal-p{tag}", "netns", ns)
            _in(ns, "link", "set", f"pseal-p{tag}", "name", "eth0")
            _in(ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _in(ns, "link", "set", "eth0", "up")
            _ip("link", "set", f"pseal-v{tag}", "master", BRIDGE)
            _ip("link", "set", f"pseal-v{tag}", "up")
        # the victim's only link: to the attacker
        _ip("link", "add", "pseal-xa", "type", "veth", "peer", "name", "pseal-ax")
        _ip("link", "set", "pseal-xa", "netns", ATTACKER)
        _ip("link", "set", "pseal-ax", "netns", VICTIM)
        _in(ATTACKER, "link", "set", "pseal-xa", "name", "eth1")
        _in(ATTACKER, "addr", "add", f"{VICTIM_GW}/24", "dev", "eth1")
        _in(ATTACKER, "link", "set", "eth1", "up")
        _in(VICTIM, "link", "set", "pseal-ax", "name", "eth0")
        _in(VICTIM, "addr", "add", f"{VICTIM_ADDR}/24", "dev", "eth0")
        _in(VICTIM, "link", "set", "eth0", "up")
        _in(VICTIM, "route", "add", "default", "via", VICTIM_GW)
        # everything the victim sends is delivered to the attacker's sockets
        _in(ATTACKER, "rule", "add", "iif", "eth1", "lookup", "100")
        _in(ATTACKER, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")

    def down(self) -> None:
        for ns in (ATTACKER, VICTIM, PLAIN):
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns, check=False)
        for dev in (BRIDGE, "pseal-vx", "pseal-vb"):
            _ip("link", "del", dev, check=False)

    def free_port(self) -> int:
        """A port free on the master's address now (for ``pydvm start --port``)."""
        s = socket.socket()
        try:
            s.bind((MASTER_ADDR, 0))
            return s.getsockname()[1]
        finally:
            s.close()

    def pids(self, ns: str) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]


def enter_netns(name: str) -> None:
    """Move the calling thread (only it) into network namespace ``name``."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# the relay
# ---------------------------------------------------------------------------

UP, DOWN = "up", "down"  # victim -> master, master -> victim


@dataclass
class Rule:
    """What to do to the first frame (after ``skip`` matching ones) that
    matches: of a connection whose peer announced ``role``, going
    ``direction``, at least ``min_size`` bytes long (length field included),
    and ``match(frame)`` if given.

    ``action``: ``flip`` (one bit of the frame at ``offset``, default its
    middle), ``drop``, ``replay`` (the frame, then the same bytes again),
    ``insert`` (``data`` before the frame), ``cut`` (half the frame, then
    both sides of the connection closed)."""

    action: str
    direction: str = DOWN
    role: str | None = None
    min_size: int = 0
    skip: int = 0
    offset: int | None = None
    data: bytes = b""
    match: Callable[[bytes], bool] | None = None
    #: set when the rule has acted; ``where`` says on what.
    fired: threading.Event = field(default_factory=threading.Event)
    where: tuple = ()


class Half:
    """One direction of one relayed connection."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.frames: list[bytes] = []
        self._buf = bytearray()
        self.lock = threading.Lock()  # one writer at a time on the destination

    def feed(self, data: bytes) -> list[bytes]:
        self.raw += data
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = struct.unpack_from("!I", self._buf)
            if len(self._buf) < 4 + n:
                break
            out.append(bytes(self._buf[:4 + n]))
            del self._buf[:4 + n]
        self.frames += out
        return out


class Conn:
    """One connection the victim host made, relayed."""

    def __init__(self, index: int, victim: socket.socket, master: socket.socket | None,
                 peer: tuple) -> None:
        self.index = index
        self.victim, self.master = victim, master
        self.peer = peer
        self.halves = {UP: Half(), DOWN: Half()}
        self.closed = threading.Event()

    @property
    def role(self) -> str | None:
        """The role the victim's first frame announced in clear (its ``seal``
        message on a sealed link, its ``auth`` on a clear one)."""
        frames = self.halves[UP].frames
        if not frames:
            return None
        try:
            first = msgpack.unpackb(frames[0][4:], raw=False, strict_map_key=False)
        except Exception:
            return None
        return first.get("role") if isinstance(first, dict) else None

    def first(self, direction: str) -> dict | None:
        """The first frame of ``direction``, decoded (a clear one)."""
        frames = self.halves[direction].frames
        if not frames:
            return None
        return msgpack.unpackb(frames[0][4:], raw=False, strict_map_key=False)

    def close(self) -> None:
        for s in (self.victim, self.master):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        self.closed.set()


class Mitm(threading.Thread):
    """The attacker's relay on the master's ``port`` (see the module docstring)."""

    def __init__(self, port: int, master: tuple[str, int] | None = None) -> None:
        super().__init__(daemon=True, name="mitm")
        self.port = port
        self.master = master or (MASTER_ADDR, port)
        self.conns: list[Conn] = []
        self.rules: list[Rule] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._halt = threading.Event()
        self._listener: socket.socket | None = None
        self._error: BaseException | None = None
        #: when set: ``impersonate(conn) -> bytes`` answers new connections
        #: in the master's stead (nothing is relayed to it).
        self.impersonate: Callable[[Conn], bytes] | None = None
        #: when set: applied to the master's first frame (its challenge) of
        #: each new connection, before the victim gets it.
        self.rewrite_challenge: Callable[[dict], dict] | None = None

    # -- control ----------------------------------------------------------

    def start(self) -> "Mitm":  # type: ignore[override]
        super().start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the relay did not start: {self._error}")
        if self._error is not None:
            raise RuntimeError(f"the relay did not start: {self._error}")
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        for c in list(self.conns):
            c.close()
        self.join(10)

    def arm(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def capture(self) -> bytes:
        """Every byte relayed so far, both ways, all connections."""
        with self._lock:
            return b"".join(bytes(c.halves[d].raw) for c in self.conns for d in (UP, DOWN))

    def by_role(self, role: str) -> list[Conn]:
        with self._lock:
            return [c for c in self.conns if c.role == role]

    def inject(self, conn: Conn, direction: str, data: bytes) -> None:
        """Write ``data`` into ``conn`` now, between two whole frames."""
        half = conn.halves[direction]
        dest = conn.master if direction == UP else conn.victim
        assert dest is not None
        with half.lock:
            dest.sendall(data)

    # -- the relay ------------------------------------------------------------

    def run(self) -> None:
        try:
            enter_netns(ATTACKER)
            lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lst.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
            lst.bind(("0.0.0.0", self.port))
            lst.listen(64)
            lst.settimeout(0.2)
            self._listener = lst
        except BaseException as exc:  # noqa: BLE001 -- reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        while not self._halt.is_set():
            try:
                victim, peer = lst.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            victim.settimeout(None)
            self._accepted(victim, peer)

    def _accepted(self, victim: socket.socket, peer: tuple) -> None:
        master = None
        if self.impersonate is None:
            try:
                master = socket.create_connection(self.master, timeout=10)
                master.settimeout(None)
            except OSError:
                victim.close()
                return
        with self._lock:
            conn = Conn(len(self.conns), victim, master, peer)
            self.conns.append(conn)
        if master is None:
            threading.Thread(target=self._pose, args=(conn,), daemon=True).start()
            return
        for direction, src, dst in ((UP, victim, master), (DOWN, master, victim)):
            threading.Thread(target=self._pump, args=(conn, direction, src, dst),
                             daemon=True).start()

    def _pose(self, conn: Conn) -> None:
        """Speak for the master: send what ``impersonate`` says, record
        whatever the victim answers, until it closes."""
        assert self.impersonate is not None
        try:
            conn.victim.sendall(self.impersonate(conn))
            conn.halves[DOWN].raw += b"(impersonated)"
            conn.victim.settimeout(10)
            while True:
                data = conn.victim.recv(65536)
                if not data:
                    break
                conn.halves[UP].feed(data)
        except OSError:
            pass
        finally:
            conn.close()

    def _pump(self, conn: Conn, direction: str, src: socket.socket,
              dst: socket.socket) -> None:
        half = conn.halves[direction]
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                for frame in half.feed(data):
                    if not self._forward(conn, direction, half, frame, dst):
                        conn.close()
                        return
        except OSError:
            pass
        try:  # the other pump ends when its source closes in turn
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _forward(self, conn: Conn, direction: str, half: Half, frame: bytes,
                 dst: socket.socket) -> bool:
        """Send ``frame`` on (as the rules say); False to end the connection."""
        index = len(half.frames) - 1
        if (direction == DOWN and index == 0 and self.rewrite_challenge is not None):
            msg = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
            body = msgpack.packb(self.rewrite_challenge(msg), use_bin_type=True)
            frame = struct.pack("!I", len(body)) + body
        rule = self._rule_for(conn, direction, frame)
        out = [frame]
        if rule is not None:
            rule.where = (conn.index, conn.role, direction, index, len(frame))
            if rule.action == "flip":
                b = bytearray(frame)
                at = rule.offset if rule.offset is not None else 4 + (len(frame) - 4) // 2
                b[at] ^= 0x04
                out = [bytes(b)]
            elif rule.action == "drop":
                out = []
            elif rule.action == "replay":
                out = [frame, frame]
            elif rule.action == "insert":
                out = [rule.data, frame]
            elif rule.action == "cut":
                with half.lock:
                    dst.sendall(frame[:len(frame) // 2])
                rule.fired.set()
                time.sleep(0.2)
                return False
            else:
                raise ValueError(f"unknown action {rule.action!r}")
        with half.lock:
            for piece in out:
                dst.sendall(piece)
        if rule is not None:
            rule.fired.set()
        return True

    def _rule_for(self, conn: Conn, direction: str, frame: bytes) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.fired.is_set() or rule.direction != direction:
                    continue
                if rule.role is not None and conn.role != rule.role:
                    continue
                if len(frame) < rule.min_size or (rule.match is not None
                                                  and not rule.match(frame)):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                self.rules.remove(rule)
                return rule
        return None
