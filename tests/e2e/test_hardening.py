"""Where the per-DVM secret may and may not be, and who may enter the DVM's files.

One DVM (daemons a, b, c, debug logging on) runs a job with one process per
node for the whole module; after a successful tool handshake, a refused one
and some data traffic, the tests look for its secret -- the hex string of
``$PYDVM_STATE_DIR/<DVMID>.secret`` and the 32 raw bytes it stands for -- in
every process's command line and environment, in every log file, and in
every file readable by group or others under the test's directory and
``$TMPDIR/pydvm-*``.  The secret file must be 0600 in a 0700 directory, the
``--uri-file`` 0600, and the daemons' socket directories closed to group and
others.
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from dvmkit import LineReader, pid_alive, start_dvm
from rawpeers import Peer, daemon_sockets, master_uri
from pydvm.runtime.shared.auth import mac

pytestmark = pytest.mark.e2e

#: Bound on each waited-for line of the job.
LINE_TIMEOUT = 30
#: Largest file read whole when looking for the secret (bigger: read in chunks).
CHUNK = 1 << 20

JOB = ('pydvm publish "hard$PYDVM_RANK=v" >/dev/null && '
       'echo "UP $PYDVM_RANK $$ $PYDVM_NODE $PYDVM_SERVER"; '
       # no bound of its own (a count of sleeps ran out under load); the go file
       # or the DVM's stop ends it
       'while [ ! -e "$1" ]; do sleep 0.05; done')


@dataclass
class Hardened:
    dvm: object
    tmp: Path
    secret_path: Path
    secret_hex: str
    secret: bytes
    job_pids: dict          # node -> pid of the job process there
    servers: dict           # node -> $PYDVM_SERVER of the job process there
    tool_pid: int           # the `pydvm run` of the job

    def forms(self) -> dict[str, bytes]:
        """Every spelling of the secret looked for."""
        h = self.secret_hex
        return {
            "hex": h.encode(),
            "HEX": h.upper().encode(),
            "raw bytes": self.secret,
            "repr of the bytes": repr(self.secret)[2:-1].encode(),
            "base64": base64.b64encode(self.secret).rstrip(b"="),
        }


@pytest.fixture(scope="module")
def hard(tmp_path_factory):
    """A DVM (a, b, c) with debug logs, a job on every node, and some auth traffic done."""
    tmp = tmp_path_factory.mktemp("hardening")
    mp = pytest.MonkeyPatch()
    mp.setenv("PYDVM_DEBUG", "1")  # inherited by the master and daemons: the chattiest logs
    try:
        dvm = start_dvm(tmp, mca={"prte_data_server_verbose": "2"})
    finally:
        mp.undo()
    go = tmp / "go"
    proc = dvm.run_bg("-n", "3", "sh", "-c", JOB, "sh", str(go))
    out = LineReader(proc.stdout)
    try:
        pids, servers = {}, {}
        for rank in range(3):
            _, _, pid, node, server = out.wait_line(f"UP {rank} ", LINE_TIMEOUT).split()
            pids[node], servers[node] = int(pid), server
        assert set(pids) == {"a", "b", "c"}, pids
        dvmid = master_uri(dvm).dvmid
        secret_path = Path(dvm.env["PYDVM_STATE_DIR"]) / f"{dvmid}.secret"
        secret_hex = secret_path.read_text().strip()
        secret = bytes.fromhex(secret_hex)
        assert len(secret) == 32
        _auth_traffic(dvm, secret)
        yield Hardened(dvm, tmp, secret_path, secret_hex, secret, pids, servers, proc.pid)
    finally:
        go.touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        dvm.stop()


def _auth_traffic(dvm, secret: bytes) -> None:
    """A good tool handshake with a data request, and a refused one, so the logs have them."""
    uri = master_uri(dvm)
    peer = Peer.tcp(uri.host, uri.port)
    ch = peer.recv()
    assert peer.call({"t": "auth", "role": "tool", "mac": mac(secret, ch["nonce"], "tool")})[
        "status"] == 0
    assert peer.call({"t": "lookup", "keys": ["hard0"], "wait": 0, "timeout": 5})["status"] == 0
    peer.close()
    peer = Peer.tcp(uri.host, uri.port)
    ch = peer.recv()
    wrong = bytearray(mac(secret, ch["nonce"], "tool"))
    wrong[0] ^= 1
    assert peer.call({"t": "auth", "role": "tool", "mac": bytes(wrong)})["status"] != 0
    peer.close()
    p = dvm.cmd("store", "--json")
    assert p.returncode == 0, p.stderr


def _find(data: bytes, forms: dict[str, bytes]) -> list[str]:
    return [name for name, form in forms.items() if form in data]


def _scan_file(path: Path, forms: dict[str, bytes]) -> list[str]:
    """The forms of the secret in ``path`` (read in overlapping chunks)."""
    found: set[str] = set()
    overlap = max(len(f) for f in forms.values())
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            found.update(_find(tail + chunk, forms))
            tail = chunk[-overlap:]
    return sorted(found)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---------------------------------------------------------------------------
# where the secret must not be
# ---------------------------------------------------------------------------


def test_secret_never_in_any_process_command_line_or_environment(hard):
    """No process's /proc/PID/cmdline or /proc/PID/environ holds the DVM secret, in any form."""
    dvm = hard.dvm
    ours = {"master": dvm.pid, **{f"daemon {n}": p for n, p in dvm.daemon_pids.items()},
            **{f"job on {n}": p for n, p in hard.job_pids.items()}, "pydvm run": hard.tool_pid}
    for what, pid in ours.items():
        assert pid_alive(pid), f"{what} (pid {pid}) is not running during the scan"
    forms = hard.forms()
    leaks, scanned, unreadable = [], set(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{entry}/{part}").read_bytes()
            except FileNotFoundError:
                continue  # gone meanwhile
            except (PermissionError, ProcessLookupError, OSError):
                unreadable.append(f"{entry}/{part}")
                continue
            scanned.add(int(entry))
            shown = data.replace(b"\0", b" ")[:300]
            for name in _find(data, forms):
                leaks.append(f"pid {entry} {part} holds the secret ({name}): {shown!r}")
    missing = {what: pid for what, pid in ours.items() if pid not in scanned}
    assert not missing, f"could not read the DVM's own processes: {missing} ({unreadable[:10]})"
    assert not leaks, "\n".join(leaks)


def test_secret_never_in_any_log_file(hard):
    """No file of the DVM's --log-dir (debug logging, verbose store) holds the secret, in any form."""
    logs = sorted(p for p in hard.dvm.log_dir.rglob("*") if p.is_file())
    names = {p.name for p in logs}
    assert {"master.log", "a.log", "b.log", "c.log"} <= names, names
    assert any(p.stat().st_size for p in logs), "every log is empty: nothing was checked"
    leaks = {str(p): found for p in logs if (found := _scan_file(p, hard.forms()))}
    assert not leaks, f"the secret is in log files: {leaks}"


def test_secret_never_in_a_file_readable_by_group_or_others(hard):
    """No regular file readable by group or others, under the test dir or $TMPDIR/pydvm-*, holds the secret."""
    roots = [hard.tmp, *sorted(Path(tempfile.gettempdir()).glob("pydvm-*"))]
    if Path("/tmp") != Path(tempfile.gettempdir()):
        roots += sorted(Path("/tmp").glob("pydvm-*"))
    leaks, checked = [], 0
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                path = Path(dirpath) / name
                try:
                    st_ = os.lstat(path)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st_.st_mode) or not st_.st_mode & 0o044:
                    continue
                checked += 1
                if found := _scan_file(path, hard.forms()):
                    leaks.append(f"{path} (mode {stat.S_IMODE(st_.st_mode):o}): {found}")
    assert checked, f"no group- or other-readable file at all under {roots}: nothing was checked"
    assert not leaks, "the secret is in files others can read:\n" + "\n".join(leaks)


# ---------------------------------------------------------------------------
# modes
# ---------------------------------------------------------------------------


def test_secret_file_is_0600_in_a_0700_directory(hard):
    """The secret file is mode 0600 and $PYDVM_STATE_DIR 0700, both owned by the DVM's user."""
    assert _mode(hard.secret_path) == 0o600, oct(_mode(hard.secret_path))
    assert _mode(hard.secret_path.parent) == 0o700, oct(_mode(hard.secret_path.parent))
    for p in (hard.secret_path, hard.secret_path.parent):
        assert os.stat(p).st_uid == os.getuid(), p


def test_uri_file_is_0600(hard):
    """The --uri-file is mode 0600 and holds the URI (which carries no secret)."""
    path = hard.tmp / "uri"
    assert _mode(path) == 0o600, oct(_mode(path))
    assert path.read_text().strip() == hard.dvm.uri
    assert hard.secret_hex not in path.read_text()


def test_daemon_socket_directories_are_closed_to_group_and_others(hard):
    """Each daemon's socket directory (parent of $PYDVM_SERVER) and $TMPDIR/pydvm-UID have mode & 0o077 == 0."""
    sockets = daemon_sockets(hard.dvm)
    assert set(sockets) == {"a", "b", "c"}, sockets
    assert {n: str(Path(s)) for n, s in hard.servers.items()} == sockets, \
        f"the jobs' $PYDVM_SERVER {hard.servers} are not the daemons' sockets {sockets}"
    base = Path(tempfile.gettempdir()) / f"pydvm-{os.getuid()}"
    bad = {}
    for node, server in sockets.items():
        d = Path(server).parent
        assert d.parent == base, (server, base)
        if _mode(d) & 0o077:
            bad[str(d)] = oct(_mode(d))
        if _mode(server) & 0o077:
            bad[server] = oct(_mode(server))
    if _mode(base) & 0o077:
        bad[str(base)] = oct(_mode(base))
    assert not bad, f"open to group or others: {bad}"
