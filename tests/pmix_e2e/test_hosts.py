"""PMIx and MPI across real network stacks: nodes in network namespaces of their own.

Test hosts ``pm1`` and ``pm2`` (tag 241, so they never collide with the
``a``/``b``/``c`` hosts of tests/multinode) each run a daemon started by the
``ssh`` launcher through ``ip netns exec``; the master, with the head node
named like this machine, listens on the bridge.  Fences, direct modex and
the connect of two jobs cross the bridge through the master.  Open MPI's
TCP transport is kept on the bridge's subnet.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "multinode"))

from pmixkit import HEAD, found, statuses  # noqa: E402
from dvmkit import LineReader, finish, lines, start_dvm  # noqa: E402
from hostnet import HostNet, unavailable_reason  # noqa: E402

TAG = 241
HOSTS = ["pm1", "pm2"]


@pytest.fixture(scope="module")
def net():
    why = unavailable_reason()
    if why:
        pytest.skip(f"PMIx host tests need test hosts: {why}")
    with HostNet(len(HOSTS), tag=TAG, want=list(HOSTS)) as n:
        yield n


@pytest.fixture(scope="module")
def hdvm(net, tmp_path_factory, libpmix):
    tmp = tmp_path_factory.mktemp("hosts-dvm")
    d = start_dvm(tmp, ",".join([HEAD, *HOSTS]),
                  {"plm_ssh_agent": "ip netns exec", "pydvm_pmix": "on"},
                  extra=["--launcher", "ssh", "--bind", net.master_addr])
    # Open MPI between namespaces: only the bridge's subnet is a path.
    d.env["OMPI_MCA_btl_tcp_if_include"] = f"10.250.{TAG}.0/24"
    d.env["OMPI_MCA_btl"] = "self,tcp"
    try:
        yield d
    finally:
        d.stop()


def test_pmix_info_reports_a_pmix_server_on_every_host(hdvm):
    info = hdvm.cmd("info", check=True).stdout
    for h in HOSTS:
        assert f"PMIx on node {h}: available, OpenPMIx" in info, info


@pytest.mark.parametrize("collect", [1, 0])
def test_fence_and_direct_modex_between_hosts(hdvm, pmix_ops, collect):
    p = hdvm.run("--tag-output", "--host", "pm1", "-n", "1", pmix_ops, "put:hk:v0", "commit",
                 f"fence:{collect}", "get:1:hk", "sleep:1500", ":", "--host", "pm2", "-n", "1", pmix_ops,
                 "put:hk:v1", "commit", f"fence:{collect}", "get:0:hk", "sleep:1500")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("FENCE status=0") == 2
    assert p.stdout.count("GET status=0 type=3 value=v") == 2, p.stdout


def test_pmix_publish_on_one_host_is_found_from_another_and_from_the_head(hdvm, pmix_ops):
    p = hdvm.run("--host", "pm1", "-n", "1", pmix_ops, "pubd:persist=persist/0:hx:uint32:7")
    assert statuses(p.stdout, "PUBLISH") == [0], p.stdout + p.stderr
    for host in ("pm2", HEAD):
        q = hdvm.run("--host", host, "-n", "1", pmix_ops, "look:hx")
        assert found(q.stdout)["hx"][:2] == (14, "7"), q.stdout
    hdvm.run("-n", "1", "pydvm", "unpublish", "hx")


@pytest.mark.parametrize("where", [["pm1:1,pm2:1"], [f"{HEAD}:1,pm2:1"]],
                         ids=["two-hosts", "head-and-host"])
def test_mpi_names_across_hosts(hdvm, mpicc, where):
    p = hdvm.run("--host", *where, "-n", "2", mpicc("mpi_names"), timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("LOOKUP rc=0 port=port-of-rank-0") == 2
    assert p.stdout.count("LOOKUP2 rc=38 class=38") == 2


def test_accept_connect_between_jobs_on_two_hosts(hdvm, mpicc):
    bg = hdvm.run_bg("--host", "pm1", "-n", "1", mpicc("mpi_server"), "svc-hosts")
    out = LineReader(bg.stdout)
    try:
        assert out.wait_line("PUBLISHED", timeout=60) == "PUBLISHED rc=0"
        p = hdvm.run("--host", "pm2", "-n", "1", mpicc("mpi_client"), "svc-hosts", timeout=90)
        assert p.returncode == 0, p.stdout + p.stderr
        assert lines(p, "RECV") == ["RECV val=42"]
        assert finish(bg) == 0
    finally:
        if bg.poll() is None:
            bg.kill()
    assert "GOT back=43" in out.join()
