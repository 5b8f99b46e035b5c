"""A private sshd on 127.0.0.1 for testing the ``ssh`` launcher for real.

Generates a host key and a client key in a temporary directory, starts
``sshd -D`` on a free unprivileged port that accepts only that client key,
and writes an ``ssh_config`` whose host aliases (``node1``, ``node2``, ...)
all reach it.  ``agent`` is then the ``plm_ssh_agent`` value a cluster user
would write: ``ssh -F <config>``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def unavailable_reason() -> str:
    if not os.path.exists(SSHD):
        return "openssh-server (sshd) is not installed"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "the ssh client is not installed"
    if os.geteuid() != 0:
        return "the test sshd needs root to switch to the test user"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestSshd:
    __test__ = False  # not a pytest test class

    def __init__(self, workdir: Path, aliases: list[str]) -> None:
        self.dir = workdir
        self.aliases = aliases
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def agent(self) -> str:
        return f"ssh -F {self.dir / 'ssh_config'}"

    def __enter__(self) -> "TestSshd":
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                           check=True, timeout=30)
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        os.chmod(d / "authorized_keys", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        (d / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "UsePAM no\nStrictModes no\nPidFile none\nLogLevel VERBOSE\n"
            "AcceptEnv no\nMaxStartups 100\nMaxSessions 100\n")
        lines = []
        for alias in self.aliases:
            lines.append(
                f"Host {alias}\n  HostName 127.0.0.1\n  Port {self.port}\n"
                f"  IdentityFile {d / 'client_key'}\n  IdentitiesOnly yes\n"
                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                "  BatchMode yes\n  LogLevel ERROR\n")
        (d / "ssh_config").write_text("\n".join(lines))
        self.log = open(d / "sshd.log", "w")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(d / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("sshd did not start listening")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
