"""The ssh launcher over a real sshd, as a cluster user would run it."""

from __future__ import annotations

import pytest

import dvmkit
from dvmkit import lines, pid_alive, wait_for
from sshd import TestSshd, unavailable_reason

_REASON = unavailable_reason()


@pytest.fixture
def sshd(tmp_path):
    if _REASON:
        pytest.skip(f"ssh launcher test needs sshd: {_REASON}")
    with TestSshd(tmp_path / "ssh", ["node1", "node2"]) as s:
        yield s


def test_dvm_over_real_ssh_runs_a_cross_node_job_and_stops_cleanly(tmp_path, sshd):
    """Daemons started through 'ssh -F config nodeN' serve a cross-node rendezvous; stop leaves nothing."""
    dvm = dvmkit.start_dvm(tmp_path / "dvm", "node1,node2",
                           {"plm_ssh_agent": sshd.agent}, extra=["--launcher", "ssh"])
    try:
        p = dvm.run("--host", "node1", "-n", "1", "pydvm", "publish", "via=ssh",
                    "--persistence", "session")
        assert p.returncode == 0, p.stderr
        q = dvm.run("--host", "node2", "-n", "1", "pydvm", "lookup", "via")
        assert q.returncode == 0, q.stderr
        assert lines(q, "FOUND")[0].startswith("FOUND via ssh from ")
        assert "Accepted publickey" in (tmp_path / "ssh" / "sshd.log").read_text()
        r = dvm.run("-n", "2", "sh", "-c", 'echo "$PYDVM_NODE"')
        assert sorted(r.stdout.split()) == ["node1", "node2"]
    finally:
        dvm.stop()
    wait_for(lambda: not any(pid_alive(p) for p in dvm.daemon_pids.values()), timeout=20,
             what="the ssh-launched daemons to exit")
