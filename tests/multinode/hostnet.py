"""Test hosts: network namespaces on a private bridge, one per node.

Each host ``pdvm<tag>-hN`` is a network namespace with its own loopback and an
``eth0`` on the bridge ``pdvm<tag>-br`` (the veth's other end is
``pdvm<tag>-vN`` in the root namespace).  The bridge carries
``10.250.T.1/24`` -- the master listens there -- and host N has
``10.250.T.(10+N)``.  Nothing is routed off the bridge: every address is one
of these hosts.  Daemons reach the master over their own network stack, so
losing a host's link is a real network failure, not a process signal.

Hosts with given names (``want``) are machine-wide: two test runs on one
machine (say, two checkouts) would tear down each other's.  A lock file per
set of names (``/run/lock/pydvm-hostnet-<names>.lock``) makes the second
wait for the first.

Creating namespaces needs root and iproute2; :func:`unavailable_reason`
says why not when they cannot be made.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dvmkit

IP = shutil.which("ip") or "/usr/sbin/ip"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable_reason() -> str:
    """'' if test hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the suite as root, as CI does)"
    if not os.path.exists(IP):
        return "iproute2 ('ip') is not installed"
    name = f"pdvmprobe{os.getpid()}"
    p = _ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return ""


class Topology:
    """Test hosts made under a machine-wide lock named by ``lock_name()``
    (released by close, even if the test crashes): ``up()`` on enter,
    ``down()`` on exit and when ``up()`` fails."""

    _lock: int | None = None

    def lock_name(self) -> str:
        raise NotImplementedError

    def up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        lock_dir = "/run/lock" if os.path.isdir("/run/lock") else "/tmp"
        self._lock = os.open(f"{lock_dir}/{self.lock_name()}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self.up()
        except BaseException:
            self.down()
            self._unlock()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


@dataclass
class HostNet(Topology):
    """N namespaces on one bridge.  Use as a context manager; always cleans up."""

    n: int
    tag: int = field(default_factory=lambda: os.getpid() % 200 + 1)
    #: host (namespace) names; default ``pdvm<tag>-h1`` ... ``-hN``.
    want: list[str] | None = None
    names: list[str] = field(default_factory=list)
    _lock: int | None = None

    @property
    def prefix(self) -> str:
        return f"pdvm{self.tag}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def master_addr(self) -> str:
        return f"10.250.{self.tag}.1"

    def addr(self, i: int) -> str:
        return f"10.250.{self.tag}.{10 + i}"

    def veth(self, i: int) -> str:
        return f"{self.prefix}-v{i}"

    def lock_name(self) -> str:
        key = "-".join(sorted(self.want)) if self.want else self.prefix
        return f"pydvm-hostnet-{key}"

    def up(self) -> None:
        self.down()  # leftovers of a crashed earlier run with the same tag
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.master_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(1, self.n + 1):
            ns = self.want[i - 1] if self.want else f"{self.prefix}-h{i}"
            _ip("netns", "add", ns)
            self.names.append(ns)
            _ip("link", "add", self.veth(i), "type", "veth", "peer", "name", f"{self.prefix}-p{i}")
            _ip("link", "set", f"{self.prefix}-p{i}", "netns", ns)
            _ip("netns", "exec", ns, IP, "link", "set", f"{self.prefix}-p{i}", "name", "eth0")
            _ip("netns", "exec", ns, IP, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("netns", "exec", ns, IP, "link", "set", "eth0", "up")
            _ip("netns", "exec", ns, IP, "link", "set", "lo", "up")
            _ip("link", "set", self.veth(i), "master", self.bridge)
            _ip("link", "set", self.veth(i), "up")

    def pids(self, name: str) -> list[int]:
        p = _ip("netns", "pids", name, check=False)
        return [int(x) for x in p.stdout.split()]

    def kill_host(self, name: str) -> None:
        """The host dies: every process in it is SIGKILLed and its link removed."""
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        i = self.names.index(name) + 1
        _ip("link", "del", self.veth(i), check=False)

    def link(self, name: str, up: bool) -> None:
        i = self.names.index(name) + 1
        _ip("link", "set", self.veth(i), "up" if up else "down")

    def down(self) -> None:
        out = _ip("netns", "list", check=False).stdout
        mine = set(self.want or ())
        for line in out.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(f"{self.prefix}-h") or ns in mine:
                for pid in self.pids(ns):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _ip("netns", "del", ns, check=False)
        links = _ip("-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                dev = parts[1].strip().split("@")[0]
                if dev.startswith(f"{self.prefix}-"):
                    _ip("link", "del", dev, check=False)
        self.names = []


def start_net_dvm(tmp: Path, net: HostNet, hosts: list[str] | None = None,
                  mca: dict[str, str] | None = None) -> dvmkit.Dvm:
    """A DVM whose daemons run in ``net``'s namespaces, launched over 'ssh'."""
    import dvmkit  # tests/e2e, on the path of every suite that makes test hosts

    mca = dict(mca or {})
    mca.setdefault("plm_ssh_agent", "ip netns exec")
    return dvmkit.start_dvm(
        tmp, ",".join(hosts or net.names), mca,
        extra=["--launcher", "ssh", "--bind", net.master_addr])
