"""The direct data path across test hosts: a client in node b's network
namespace reaches the master over the bridge, one hop, with the credential
b's daemon gave it; the direct-data cases of ``tests/e2e`` re-run here
unchanged with each daemon on its own host."""

import sys

from dvmkit import job_script, lines
from test_direct_data import (  # noqa: F401
    direct_counts,
    test_a_parked_lookup_on_a_direct_connection_is_answered_by_another_jobs_publish,
    test_a_proc_item_published_directly_goes_when_its_process_exits,
    test_daemon_node_client_publishes_looks_up_and_unpublishes_over_the_direct_path,
)

SNIPPET = """
from pydvm import Client
with Client() as c:
    c.publish({"from-b": "1"})
    print("DIRECT", c.direct, c._dch.sock.getsockname()[0], c._dch.sock.getpeername()[0])
    print("FOUND", c.lookup("from-b")["from-b"])
"""


def test_a_client_in_another_namespace_connects_to_the_master_over_the_bridge(dvm, hostnet):
    """The direct connection of a client on b goes from b's own address to the
    master's bridge address; what it published is found from node c."""
    before = direct_counts(dvm)
    p = dvm.run("--host", "b", "-n", "1", sys.executable, "-c", SNIPPET)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "DIRECT") == [f"DIRECT True {hostnet.addr(2)} {hostnet.master_addr}"], p.stdout
    assert lines(p, "FOUND") == ["FOUND 1"], p.stdout
    assert direct_counts(dvm)["accepted"] == before["accepted"] + 1
    q = dvm.run("--host", "c", "-n", "1", *job_script("direct_ops"), "basic")
    assert "DIRECT True" in q.stdout, q.stdout + q.stderr
