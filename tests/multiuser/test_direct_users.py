"""The direct data path with real uids: the credential stays with its user.

The DVM's nodes a and b have daemons, so every job here takes the direct
path (the other tests of this directory check its identities too: items
accounted to their publisher's uid, claims refused).  These are about the
credential itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

A, B = "pdvmtesta", "pdvmtestb"

PROBE = """
import sys
from pydvm.client import direct as _direct
from pydvm.errors import PMIxError
from pydvm.runtime.shared.auth import DvmUri
from pydvm.runtime.shared.credential import Credential
uri, token, nspace, rank, uid = sys.argv[1:6]
unix = sys.argv[6] if len(sys.argv) > 6 else ""
parts = token.split(":")
if uid != "-":
    parts[1] = uid
cred = Credential.parse(":".join(parts))
try:
    ch = _direct.open_blocking(_direct.DirectInfo(DvmUri.parse(uri), cred, nspace, int(rank),
                                                  unix=unix))
    print("STATUS", "OK" if ch is not None else "UNREACHABLE",
          ch.sock.family.name if ch is not None else "")
except PMIxError as exc:
    print("STATUS", exc.status.pmix_name)
"""


@pytest.fixture
def probe(readable_script):
    return readable_script(PROBE)


def test_a_users_credential_is_unreadable_to_others_and_cannot_be_turned_into_another_uid(
        mudvm, users, probe):
    """A's job process holds its credential: B cannot read A's environment;
    A's credential edited to name B's uid is refused NO_PERMISSIONS; as it
    was made, it is accepted (for A)."""
    job = mudvm.popen_as(A, "run", "--host", "b", "-n", "1", "sh", "-c",
                         'echo "$$ $PYDVM_NSPACE $PYDVM_RANK $PYDVM_DIRECT_CRED"; sleep 20')
    try:
        pid, nspace, rank, token = job.stdout.readline().split()
        assert token.startswith(f"v1:{users[A]}:"), token
        p = mudvm.as_user_python(B, "-c", f"open('/proc/{pid}/environ').read()")
        assert p.returncode != 0 and "PermissionError" in p.stderr, (p.stdout, p.stderr)
        forged = mudvm.as_user_python(A, probe, mudvm.uri, token, nspace, rank,
                                      str(users[B]))
        assert "STATUS PMIX_ERR_NO_PERMISSIONS" in forged.stdout, (forged.stdout, forged.stderr)
        real = mudvm.as_user_python(A, probe, mudvm.uri, token, nspace, rank, "-")
        assert "STATUS OK" in real.stdout, (real.stdout, real.stderr)
    finally:
        job.kill()
        job.wait(timeout=30)


def test_on_the_direct_data_socket_a_credential_works_only_for_the_uid_it_names(mudvm, users,
                                                                              probe):
    """The master's direct-data Unix socket is open to every user (0666 in a
    0711 directory) and checks the peer's uid against the credential: A's
    credential, unaltered, is accepted from A and refused from B."""
    info = mudvm.as_user(None, "info")
    assert info.returncode == 0, info.stderr
    path = info.stdout.split("direct data socket (same-host nodes): ", 1)[1].split(";")[0]
    sock = Path(path)
    assert sock.stat().st_mode & 0o777 == 0o666 and sock.parent.stat().st_mode & 0o777 == 0o711
    job = mudvm.popen_as(A, "run", "--host", "b", "-n", "1", "sh", "-c",
                         'echo "$$ $PYDVM_NSPACE $PYDVM_RANK $PYDVM_DIRECT_CRED"; sleep 20')
    try:
        _, nspace, rank, token = job.stdout.readline().split()
        stolen = mudvm.as_user_python(B, probe, mudvm.uri, token, nspace, rank, "-", path)
        assert "STATUS PMIX_ERR_NO_PERMISSIONS" in stolen.stdout, (stolen.stdout, stolen.stderr)
        real = mudvm.as_user_python(A, probe, mudvm.uri, token, nspace, rank, "-", path)
        assert "STATUS OK AF_UNIX" in real.stdout, (real.stdout, real.stderr)
        assert f"peer runs as uid {users[B]}" in (mudvm.log_dir / "master.log").read_text()
    finally:
        job.kill()
        job.wait(timeout=30)
