"""A DVM that lost a node keeps working; a relay link cut without a FIN is noticed.

Issue 8, items 5 and 7.  Daemons live on their own test hosts (network
namespaces); a lost host is a real network failure and a cut link is a veth
set down, so no FIN or RST ever reaches the other side.
"""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from hostnet import start_net_dvm
from dvmkit import Dvm, LineReader, finish, lines, status, wait_for
from hostnet import HostNet

HB = {"pydvm_heartbeat_interval": "0.5"}


def _nodes(p) -> list[str]:
    return sorted(ln.split()[1] for ln in lines(p, "NODE "))


def test_after_a_node_is_lost_jobs_and_sessions_use_the_live_nodes(tmp_path, hostnet):
    """Issue 8.5: once b is lost, the default mapping and new sessions use a and c;
    a job naming only b is refused naming it; `pydvm info` says b is lost."""
    dvm = start_net_dvm(tmp_path, hostnet, mca=HB)
    try:
        hostnet.kill_host("b")
        wait_for(lambda: "node b slots=1 lost" in dvm.cmd("info").stdout, timeout=20,
                 what="b to be declared lost")
        p = dvm.run("-n", "1", "true")
        assert p.returncode == 0, p.stderr
        p = dvm.run("-n", "4", "sh", "-c", 'echo "NODE $PYDVM_NODE"')
        assert p.returncode == 0, p.stderr
        assert _nodes(p) == ["a", "a", "c", "c"]
        sid = dvm.cmd("session", "new", check=True).stdout.strip()
        p = dvm.run("--session", sid, "-n", "2", "sh", "-c", 'echo "NODE $PYDVM_NODE"')
        assert p.returncode == 0, p.stderr
        assert _nodes(p) == ["a", "c"]
        q = dvm.run("--host", "b", "-n", "1", "true")
        assert q.returncode != 0 and "not available: b" in q.stderr, q.stderr
        q = dvm.run("--host", "b,c", "-n", "2", "sh", "-c", 'echo "NODE $PYDVM_NODE"')
        assert q.returncode == 0 and _nodes(q) == ["c", "c"], q.stdout + q.stderr
        r = dvm.cmd("session", "new", "--hosts", "a,b")
        assert r.returncode != 0 and "not available: b" in r.stderr, r.stderr
        assert dvm.cmd("session", "end", sid).returncode == 0
    finally:
        dvm.stop()


def _in_c(hostnet, env, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", hostnet.names[2], sys.executable, "-m",
                             "pydvm", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@dataclass
class RelayOnC:
    """A data server whose daemon is on host a, and a relaying DVM living
    entirely on host c (its own loopback), so only the relay's link to the
    data server crosses the network."""

    server: Dvm
    env: dict
    uri: str
    hostnet: HostNet

    def popen(self, *args: str) -> subprocess.Popen:
        """``pydvm run --dvm RELAY ARGS...`` on host c, running on."""
        return _in_c(self.hostnet, self.env, "run", "--dvm", self.uri, *args)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        """``pydvm run --dvm RELAY ARGS...`` on host c, to its end."""
        p = self.popen(*args)
        o, e = p.communicate(timeout=60)
        return subprocess.CompletedProcess(p.args, p.returncode, o, e)


@contextmanager
def relay_on_c(tmp_path, hostnet):
    """A :class:`RelayOnC` (heartbeats every 0.5 s); everything stopped and the
    link restored afterwards."""
    server = start_net_dvm(tmp_path, hostnet, hosts=["a"], mca=HB)
    env = dict(server.env)
    relay_uri = None
    try:
        start = _in_c(hostnet, env, "start", "--daemonize", "--hosts", "r1", "--bind",
                      "127.0.0.1", "--mca", "pydvm_heartbeat_interval", "0.5",
                      "--log-dir", str(tmp_path / "relay-logs"),
                      "--data-server-uri", server.uri)
        out, err = start.communicate(timeout=60)
        assert start.returncode == 0, err
        relay_uri = out.strip()
        yield RelayOnC(server, env, relay_uri, hostnet)
    finally:
        hostnet.link("c", up=True)
        if relay_uri:
            _in_c(hostnet, env, "stop", "--dvm", relay_uri).communicate(timeout=60)
        server.stop()


def test_a_silent_partition_from_the_data_server_answers_relayed_requests_unreach(
        tmp_path, hostnet):
    """Issue 8.7: a relaying DVM on host c loses its link to the data server without
    a FIN: its waiting lookup is answered UNREACH within a few heartbeats, new
    requests fail at once, and once the link is back the relay reconnects."""
    with relay_on_c(tmp_path, hostnet) as relay:
        waiting = relay.popen("-n", "1", "pydvm", "lookup", "never", "--wait")
        reader = LineReader(waiting.stdout)
        wait_for(lambda: relay.server.store()["master"]["parked"] == 1, timeout=30,
                 what="the relayed lookup to park on the data server")
        hostnet.link("c", up=False)
        t0 = time.monotonic()
        assert reader.wait_line("STATUS", timeout=20) == "STATUS PMIX_ERR_UNREACH"
        assert time.monotonic() - t0 < 10
        finish(waiting)
        p = relay.run("-n", "1", "pydvm", "publish", "during=1")
        assert status(p) == "PMIX_ERR_UNREACH", p.stdout + p.stderr
        hostnet.link("c", up=True)
        wait_for(lambda: status(relay.run("-n", "1", "pydvm", "publish", "after=1",
                                          "--persistence", "session", "--replace"))
                 == "PMIX_SUCCESS", timeout=30, what="the relay to reconnect")
        assert "after" in relay.server.store()["master"]["keys"]
