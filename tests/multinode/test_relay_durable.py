"""Relayed purges are never lost (issue 13).

A relaying DVM on test host c sends its lifetimes to a data server that
stays up on the host side.  The network link between them is cut (a veth
set down: no FIN, no RST) while a relayed job ends, then restored: the
job's purge, queued meanwhile, is re-sent on the reconnection, so the job's
items leave the data server -- and only that job's.
"""

from __future__ import annotations

import subprocess

from conftest import start_net_dvm
from dvmkit import LineReader, finish, status, wait_for
from test_loss_and_partition import HB, _in_c


def test_a_job_ending_during_a_partition_is_purged_from_the_data_server_after_it(
        tmp_path, hostnet):
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

        def relay_run(*args: str) -> subprocess.CompletedProcess:
            p = _in_c(hostnet, env, "run", "--dvm", relay_uri, *args)
            o, e = p.communicate(timeout=60)
            return subprocess.CompletedProcess(p.args, p.returncode, o, e)

        keep = relay_run("-n", "1", "pydvm", "publish", "keep=1", "--persistence", "session")
        assert status(keep) == "PMIX_SUCCESS", keep.stdout + keep.stderr
        job = _in_c(hostnet, env, "run", "--dvm", relay_uri, "-n", "1", "sh", "-c",
                    "pydvm publish gone=1 && pydvm publish alsogone=1 --persistence app "
                    "&& sleep 2")
        reader = LineReader(job.stdout)
        reader.wait_line("PUBLISHED alsogone", timeout=30)
        keys = server.store()["master"]["keys"]
        assert {"keep", "gone", "alsogone"} <= set(keys), keys
        hostnet.link("c", up=False)
        finish(job)  # the job ends during the partition
        assert job.returncode == 0
        assert {"gone", "alsogone"} <= set(server.store()["master"]["keys"])
        hostnet.link("c", up=True)
        wait_for(lambda: set(server.store()["master"]["keys"]) == {"keep"}, timeout=30,
                 what="the queued purges to reach the data server after the reconnection")
    finally:
        hostnet.link("c", up=True)
        if relay_uri:
            _in_c(hostnet, env, "stop", "--dvm", relay_uri).communicate(timeout=60)
        server.stop()
